"""Reproducible training in three lines, on a tiny MNIST-shaped model and synthetic data.

    python examples/train_mnist_like.py --seed 1234 --lock env.lock

trains a small CNN for a few steps (CPU, no downloads) and prints the sha256 of the final
weights as JSON. Two runs with the same seed print the same hash, bit for bit; another seed
prints another. The three envlock lines are marked below; everything else is plain PyTorch.

A fourth, ``envlock.record(step, loss=...)``, does nothing unless envlock records the run:

    envlock run env.lock --record run.record --output model.pt -- python train_mnist_like.py --save model.pt
    envlock run env.lock --replay run.record      # exit 0: every loss and model.pt bit-identical
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import envlock


def synthetic_digits(n: int) -> TensorDataset:
    """Ten noisy 28x28 class prototypes: MNIST's shape, made on the spot.

    The dataset has its own fixed generator: it stands for data on disk, which does not change
    with the training seed.
    """
    g = torch.Generator().manual_seed(0)
    prototypes = torch.rand(10, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = prototypes[labels] + 0.3 * torch.randn(n, 1, 28, 28, generator=g)
    return TensorDataset(images, labels)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.25), nn.Linear(16 * 5 * 5, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out


def weights_sha256(model: nn.Module) -> str:
    """Hash of every parameter and buffer's exact bytes, in name order."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        # clone(): a fresh storage holding exactly this tensor's bytes, in order.
        h.update(bytes(tensor.detach().cpu().clone().untyped_storage()))
    return h.hexdigest()


def train(seed: int, *, epochs: int = 2, workers: int = 2, lock: str | None = None,
          save: str | None = None) -> dict[str, object]:
    envlock.seed_everything(seed)                                    # 1: seeds, recorded
    envlock.deterministic()                                          # 2: deterministic kernels

    data = synthetic_digits(256)
    loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=workers,
                        worker_init_fn=envlock.worker_init_fn,
                        generator=envlock.dataloader_generator())
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss = torch.tensor(0.0)
    step = 0
    for _ in range(epochs):
        for images, labels in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            envlock.record(step, loss=loss)                          # 4: replay record (if asked)
            step += 1
    if save:
        torch.save(model.state_dict(), save)

    result: dict[str, object] = {"seed": seed, "weights_sha256": weights_sha256(model),
                                 "final_loss": round(loss.item(), 6)}
    if lock:
        snapshot = envlock.capture()                                 # 3: stack, seed, flags
        snapshot.save(lock)
        result["lock_id"] = snapshot.short_id
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--lock", help="write the environment, seed and flags to this lock")
    parser.add_argument("--save", help="write the final weights (torch.save) to this file")
    args = parser.parse_args(argv)
    print(json.dumps(train(args.seed, epochs=args.epochs, workers=args.workers, lock=args.lock,
                           save=args.save)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
