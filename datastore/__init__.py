"""Offline datastore builder, installed as ``retrieval_draft_datastore``: corpus readers,
tokenisation, Numba sorting and counting kernels, index writing, merge, and the CLI
subcommands (build, repo, inspect, stats, merge).

It writes the format that ``retrieval_draft.store`` defines and reads; imports run one
way, from here into the runtime. Entry points: ``retrieval_draft_datastore.builder.build``
/ ``merge``, ``retrieval_draft_datastore.ray_build.build_ray`` (the same store built on Ray
Data: ``ray_tokenise``, ``ray_index``, ``kernels_merge``; needs the ``distributed`` extra),
``retrieval_draft_datastore.repo_store.update_repo_store`` (a store that follows a source tree:
``repo_files``, ``repo_cache``) and ``retrieval_draft_datastore.commands.register``.
"""
