"""Decode steps on one intra-op thread of the calling thread only (aah_core/inference/threads.py)."""

import threading

import pytest
import torch

from aah_core.inference import generate, kvcache, threads
from aah_core.inference.generate import forward_cached, new_cache
from aah_core.model import WindowedGPT
from aah_core.model_config import ModelConfig

pytestmark = pytest.mark.skipif(not threads.available(), reason="torch's intra-op threads are not OpenMP's here")


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_one_thread_scopes_the_calling_thread_only(two_threads):
    seen = {}
    with threads.one_thread():
        seen["inside"] = torch.get_num_threads()
        with threads.one_thread():
            seen["nested"] = torch.get_num_threads()
        seen["after nested"] = torch.get_num_threads()
        with threads.all_threads():
            seen["one call"] = torch.get_num_threads()
        seen["after the call"] = torch.get_num_threads()
        # a thread that starts now copies the process-wide count on its first parallel operation
        other = threading.Thread(target=lambda: seen.__setitem__("another thread", torch.get_num_threads()))
        other.start()
        other.join()
    seen["after"] = torch.get_num_threads()
    with threads.all_threads():  # outside one_thread: nothing to give back
        seen["all_threads alone"] = torch.get_num_threads()
    assert seen == {"inside": 1, "nested": 1, "after nested": 1, "one call": 2, "after the call": 1,
                    "another thread": 2, "after": 2, "all_threads alone": 2}


@pytest.mark.parametrize("call_work", [0, 1 << 40], ids=["every-call-split", "no-call-split"])
def test_decode_steps_run_on_one_thread_and_stay_exact(two_threads, monkeypatch, call_work):
    torch.manual_seed(0)
    model = WindowedGPT(ModelConfig(n_layer=2, n_head=4, d_model=32, seq_len=24, buckets=[3, 5, None])).eval()
    plan = torch.tensor([[3, 5, 24, 24], [24, 2, 24, 7]])
    idx = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    counts = []
    step = kvcache.LayerKVCache._step
    monkeypatch.setattr(kvcache.LayerKVCache, "_step",
                        lambda self, *a: counts.append(torch.get_num_threads()) or step(self, *a))
    monkeypatch.setattr(kvcache, "PARALLEL_CALL_WORK", call_work)
    cache = new_cache(model, plan, decode="buckets")
    forward_cached(model, idx[:, :10], cache, plan)
    assert torch.get_num_threads() == 2
    for t in range(10, 24):
        logits = forward_cached(model, idx[:, t : t + 1], cache, plan)
        with torch.no_grad():
            ref = model(idx[:, : t + 1], plan=plan, backend="reference")[0][:, -1]
        torch.testing.assert_close(logits, ref, rtol=0, atol=1e-5)
    assert counts == [1] * (2 * 14) and torch.get_num_threads() == 2
    monkeypatch.setattr(generate, "DECODE_ONE_THREAD_WORK", 32 * 32)  # batch 2 at width 32 is then above it
    counts.clear()
    forward_cached(model, idx[:, :1], new_cache(model, plan), plan)
    assert not counts
