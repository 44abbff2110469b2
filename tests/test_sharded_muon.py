"""Muon's Newton–Schulz orthogonalises; its sharded step on 4 real ranks is tested in test_fsdp2_knobs.py's launch."""

import pytest
import torch

from m11_helpers.sharded_muon import newton_schulz


def test_newton_schulz_orthogonalises():
    g = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))
    x = newton_schulz(g)
    s = torch.linalg.svdvals(x)
    assert x.shape == g.shape and s.min() > 0.5 and s.max() < 1.3  # singular values pushed to ≈ 1 (Jordan et al.)
    u, _, vt = torch.linalg.svd(g, full_matrices=False)
    assert torch.nn.functional.cosine_similarity(x.reshape(-1), (u @ vt).reshape(-1), dim=0) > 0.95
    with pytest.raises(ValueError, match="matrix"):
        newton_schulz(torch.randn(4))
