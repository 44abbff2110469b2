"""Sharded Muon on 4 real ranks: the slice alone is wrong, the gathered matrix is right, and what the gather costs."""

import pytest
import torch

from m11_helpers.launch import launch
from m11_helpers.sharded_muon import newton_schulz, sharded_muon_step


def test_newton_schulz_orthogonalises():
    g = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))
    x = newton_schulz(g)
    s = torch.linalg.svdvals(x)
    assert x.shape == g.shape and s.min() > 0.5 and s.max() < 1.3  # singular values pushed to ≈ 1 (Jordan et al.)
    u, _, vt = torch.linalg.svd(g, full_matrices=False)
    assert torch.nn.functional.cosine_similarity(x.reshape(-1), (u @ vt).reshape(-1), dim=0) > 0.95
    with pytest.raises(ValueError, match="matrix"):
        newton_schulz(torch.randn(4))


def test_sharded_muon_needs_the_gather():
    results = launch(sharded_muon_step, 64, 32, num_processes=4, timeout=60)
    for r in results:
        assert r["local_error"] > 0.05  # Newton–Schulz on a slice is not the slice of Newton–Schulz
        assert r["gathered_error"] < 1e-5  # gather first: equal to one process
        assert r["adamw_error"] < 1e-6 and r["adamw_extra_bytes"] == 0  # element-wise: no gather needed
        assert r["extra_gather_wire_bytes"] == 3 / 4 * r["matrix_bytes"] == 6144
