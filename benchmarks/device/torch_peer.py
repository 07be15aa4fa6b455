"""The PyTorch peer of ``benchmarks/speed/train_throughput.py``'s synthetic-input step on a GPU:
torchvision's ResNet-50 with a linear 512-D embedding head and L2 normalisation, an NCA loss
over the batch's similarity matrix (each anchor's positives against its negatives,
temperature 0.1, the 2nd-order config's loss without its mining), SGD with momentum 0.9 and
weight decay 5e-4; bfloat16 autocast, channels-last memory, random weights, one batch of
synthetic images kept on the GPU, n = 8 per class. Eager and ``torch.compile``.

  python benchmarks/device/torch_peer.py --batch_size=256 --modes=eager,compiled --out=peer.json

Images/s = steps x batch / seconds after ``--warmup`` steps (compilation), synchronised at the
end. Prints one JSON line per mode and writes the list (``--out``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
import torchvision


class Embedder(torch.nn.Module):
  """ResNet-50 features -> linear ``dim`` -> L2 normalisation."""

  def __init__(self, dim: int):
    super().__init__()
    self.backbone = torchvision.models.resnet50(weights=None)
    self.backbone.fc = torch.nn.Linear(2048, dim)

  def forward(self, x):
    return F.normalize(self.backbone(x), dim=1)


def nca_loss(e: torch.Tensor, labels: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
  """Mean over anchors of ``-log(sum_pos exp(S/T) / sum_{pos+neg} exp(S/T))`` (float32)."""
  s = (e.float() @ e.float().T) / temperature
  same = labels[:, None] == labels[None, :]
  eye = torch.eye(len(labels), dtype=torch.bool, device=e.device)
  pos = same & ~eye
  s = s.masked_fill(eye, float("-inf"))
  return (torch.logsumexp(s, 1) - torch.logsumexp(s.masked_fill(~pos, float("-inf")), 1)).mean()


def measure(mode: str, *, batch_size: int, image_size: int, steps: int, warmup: int,
            group_size: int) -> dict:
  torch.backends.cudnn.benchmark = True
  torch.backends.cuda.matmul.allow_tf32 = False   # PyTorch's default: float32 products exact
  model = Embedder(512).cuda().to(memory_format=torch.channels_last)
  opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
  images = torch.randn(batch_size, 3, image_size, image_size, device="cuda").to(
      memory_format=torch.channels_last)
  labels = torch.arange(batch_size // group_size, device="cuda").repeat_interleave(group_size)

  def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
      e = model(images)
    loss = nca_loss(e, labels)
    loss.backward()
    opt.step()
    return loss

  fn = torch.compile(step) if mode == "compiled" else step
  t0 = time.perf_counter()
  for _ in range(warmup):
    fn()
  torch.cuda.synchronize()
  warmup_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(steps):
    loss = fn()
  torch.cuda.synchronize()
  seconds = time.perf_counter() - t0
  return {"side": "torch", "mode": mode, "batch_size": batch_size, "image_size": image_size,
          "dtype": "bfloat16 autocast", "steps": steps, "warmup_s": warmup_s,
          "synthetic": steps * batch_size / seconds, "loss": float(loss),
          "torch": torch.__version__, "torchvision": torchvision.__version__,
          "device": torch.cuda.get_device_name()}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch_size", type=int, default=256)
  p.add_argument("--image_size", type=int, default=224)
  p.add_argument("--group_size", type=int, default=8)
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--modes", default="eager,compiled")
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  rows = []
  for mode in [m for m in args.modes.split(",") if m]:
    if mode not in ("eager", "compiled"):
      raise SystemExit(f"unknown mode {mode!r}; allowed: eager, compiled")
    rows.append(measure(mode, batch_size=args.batch_size, image_size=args.image_size,
                        steps=args.steps, warmup=args.warmup, group_size=args.group_size))
    print(json.dumps(rows[-1]), flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(rows, f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
