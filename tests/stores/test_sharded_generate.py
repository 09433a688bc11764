"""`datastore=` a sharded store: the plugin drafts from all its shards as one store (one n-gram and one
suffix drafter), outputs stay greedy's, and drafts found in a later shard are accepted."""

from __future__ import annotations

import pytest
import torch

import retrieval_draft
from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.store.opening import open_datastore
from retrieval_draft_datastore.shard_build import build_sharded
from tests.conftest import make_tiny_llama
from tests.datastore_fixtures import word_tokenizer

NEW_TOKENS = 20


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(model, prompt, greedy output, sharded store path): greedy's continuation is in the last shard."""
    tokenizer = word_tokenizer([], extra=100)
    model = make_tiny_llama(seed=0, vocab_size=len(tokenizer))
    prompt = torch.randint(3, len(tokenizer), (1, 12), generator=torch.Generator().manual_seed(0))
    greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False)
    root = tmp_path_factory.mktemp("sharded-generate")
    docs = root / "docs"
    docs.mkdir()
    used = set(greedy[0].tolist())
    unused = [i for i in range(3, len(tokenizer)) if i not in used]
    for n in range(6):  # filler documents first, so the useful one lands in the last shard
        (docs / f"a{n}.txt").write_text(" ".join(tokenizer.convert_ids_to_tokens(unused[n::3] * 3)))
    (docs / "z.txt").write_text(" ".join(tokenizer.convert_ids_to_tokens(greedy[0].tolist())))
    build_sharded([str(docs)], root / "store", tokenizer, 60, progress=False)
    return model, prompt, greedy, root / "store"


def test_a_sharded_store_gives_the_greedy_output_and_its_last_shard_drafts(setup):
    model, prompt, greedy, store = setup
    assert len(open_datastore(store).shards) >= 3
    planner, stats = TreePlanner(tree_budget=16), DecodeStats()
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False,
                         custom_generate=retrieval_draft.generate, datastore=str(store), draft_planner=planner,
                         draft_stats=stats, draft_learning=False, draft_memory=PluginMemory())
    assert torch.equal(out, greedy)
    assert planner.calibrators["suffix"].hits.sum() > 0 and "ngram" in planner.calibrators
    assert stats.mean_accepted > 1.5
