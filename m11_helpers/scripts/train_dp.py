"""Lesson 03's training as an Accelerate script: the same file on 1, 2 or 4 processes (or 8 GPUs).

    launch_script("train_dp.py", "--steps", "8", num_processes=4)       # from a notebook
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 4 $(m11 script train_dp.py)

The global batch stays 64 whatever the number of processes (`split_batches=True`: each rank gets
64/N rows), so the losses must match the one-process run: data parallelism changes who computes,
not what is computed (it equals `train_regression("single", global_batch=64, lr=0.1, momentum=0.9)`).
"""

import argparse
import time

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch.utils.data import DataLoader, TensorDataset

from m11_helpers.data import regression
from m11_helpers.launch import report
from m11_helpers.models import mlp
from m11_helpers.timing import synchronize

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--batch", type=int, default=64, help="global batch, split across the processes")
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()

acc = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
model = mlp(seed=0)  # the same seed everywhere; DDP's constructor broadcasts rank 0's weights anyway
opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
x_all, y_all = regression(n=4096).tensors  # (4096, 16), (4096, 4): the data train_regression() uses
data = TensorDataset(x_all[: args.steps * args.batch], y_all[: args.steps * args.batch])
loader = DataLoader(data, batch_size=args.batch)  # no shuffle: the same order on 1 or N processes
model, opt, loader = acc.prepare(model, opt, loader)  # wraps the model in DDP, shards the loader

losses, start = [], time.perf_counter()
for x, y in loader:  # x: (64/N, 16) on each rank
    loss = torch.nn.functional.mse_loss(model(x), y)
    acc.backward(loss)  # DDP all-reduces the gradients during backward
    opt.step()
    opt.zero_grad()
    losses.append(acc.reduce(loss.detach(), "mean").item())  # global loss = mean of the ranks' losses
synchronize()  # the last step's kernels have finished (a no-op on CPU)
seconds = time.perf_counter() - start

local_rows = x.shape[0]
if acc.is_main_process:  # only rank 0 logs
    print(f"{acc.num_processes} process(es), {acc.distributed_type}, {local_rows} rows per rank: "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
checksum = sum(p.detach().double().sum().item() for p in acc.unwrap_model(model).parameters())
report(losses=losses, world=acc.num_processes, kind=str(acc.distributed_type), rows_per_rank=local_rows,
       checksum=checksum, seconds=seconds)
del model, opt, loader
acc.free_memory()  # drop the prepared (DDP) models first: a live DDP model at exit can abort the process
acc.end_training()  # destroys the process group before the interpreter exits
