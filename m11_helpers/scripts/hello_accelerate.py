"""The smallest Accelerate script: every rank says hello and they agree on one number.

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 $(m11 script hello_accelerate.py)
    accelerate launch --multi_gpu --num_processes 8 $(m11 script hello_accelerate.py)   # an 8-GPU box

Lesson 00 runs it through `m11_helpers.launch.launch_script`, which prints these commands for you.
"""

import torch
from accelerate import Accelerator

from m11_helpers.launch import report

accelerator = Accelerator()
rank = accelerator.process_index
total = accelerator.reduce(torch.tensor([float(rank)], device=accelerator.device), "sum").item()
if accelerator.is_main_process:  # only rank 0 prints: N ranks printing the same line is noise
    print(f"{accelerator.num_processes} processes, {accelerator.distributed_type}, sum of ranks = {total:g}")
report(rank=rank, device=str(accelerator.device), sum_of_ranks=total)
accelerator.end_training()  # destroy the process group before exit: a live one can abort at exit
