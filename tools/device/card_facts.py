#!/usr/bin/env python3
"""The lent card's memory facts that the simulation's presets need (src/cards.rs), as one JSON
line: PyTorch's total_memory, what the driver says is free once CUDA is initialised and after
the first cuBLAS matmul, and the memory outside PyTorch's allocator each time (the CUDA context,
cuBLAS's own handles: total - free - reserved).

    python3 tools/device/card_facts.py
"""

import json

import torch


def outside(total):
    free, _ = torch.cuda.mem_get_info()
    return {"free_bytes": free, "reserved_bytes": torch.cuda.memory_reserved(), "outside_allocator_bytes": total - free - torch.cuda.memory_reserved()}


def main():
    torch.cuda.init()
    props = torch.cuda.get_device_properties(0)
    total = torch.cuda.mem_get_info()[1]
    facts = {
        "name": props.name,
        "total_memory": props.total_memory,
        "mem_get_info_total": total,
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver_free_after_init": outside(total),
    }
    x = torch.ones(256, 256, device="cuda")
    (x @ x).sum().item()
    facts["after_first_matmul"] = outside(total)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
