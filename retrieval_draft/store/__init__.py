"""Datastores as the runtime reads them: the on-disk format (``layout``, ``manifest``,
``arrow_io``, ``suffix_trie``, ``tokenizer``), the validating reader (``reader``), the
per-process cache of opened stores (``store_cache``) and the Numba query kernels
(``query``). The offline builder (``retrieval_draft_datastore``) imports these."""
