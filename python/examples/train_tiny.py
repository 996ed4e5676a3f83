# SPDX-License-Identifier: MIT
"""docs/pytorch.md's example: a tiny causal ALiBi model trained a few steps with trainable slopes."""
import torch, torch.nn as nn, torch.nn.functional as F
from alibi_torch import ALiBiMultiheadAttention

torch.manual_seed(0)
embed, attn = nn.Embedding(32, 64), ALiBiMultiheadAttention(64, 8, causal=True, trainable_slopes=True)
head = nn.Linear(64, 32)
params = [*embed.parameters(), *attn.parameters(), *head.parameters()]
opt = torch.optim.Adam(params, lr=1e-2)
for step in range(60):
    tokens = torch.randint(0, 32, (8, 4)).repeat(1, 17)  # (8, 68): a pattern repeated
    x = embed(tokens[:, :-1])
    logits = head(x + attn(x))  # (8, 67, 32)
    loss = F.cross_entropy(logits[:, 4:].reshape(-1, 32), tokens[:, 5:].reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 20 == 0 or step == 59:
        print(f"step {step:2d}  loss {loss.item():.3f}")
print("slopes:", [round(s, 4) for s in attn.slopes.tolist()])
