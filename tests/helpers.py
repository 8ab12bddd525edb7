"""Small helpers shared by the model tests (imported as `helpers`; pytest puts tests/ on the path)."""

import torch


def keep_mask(lengths, T):
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B, T), True = real


def randomize_(module, seed=0):
    """Non-trivial values everywhere (torch starts biases at 0 and norms at 1, hiding copy bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module
