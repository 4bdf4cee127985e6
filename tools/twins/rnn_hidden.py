"""Twin of `tensormem run rnn-hidden` (src/scenarios/techniques.rs `rnn_hidden`): LSTM states
carried across batches with backward(retain_graph=True) (mistake) or detached (fix). The cell
is written out as tensormem's LstmCell (two linears, narrowed gates), not nn.LSTMCell."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

import models  # noqa: E402

NAME = "rnn-hidden"
VARIANTS = ["mistake", "fix"]
PARAMETERS = [
    ("batch", "32", {"type": "integer", "min": 1, "max": 65536}),
    ("timesteps", "16", {"type": "integer", "min": 1, "max": 4096}),
    ("hidden", "512", {"type": "integer", "min": 1, "max": 16384}),
    ("steps", "4", {"type": "integer", "min": 1, "max": 128}),
]
FIX_SETTINGS = None


def program(rec, v):
    dev = rec.device
    batch, hidden, timesteps = v.int("batch"), v.int("hidden"), v.int("timesteps")
    cell = models.LstmCell(hidden // 2, hidden, torch.float32, dev)
    rec.count_parameters(cell.ordered_parameters())
    optimizer = torch.optim.SGD(cell.ordered_parameters(), lr=1e-3, momentum=0.0, weight_decay=0.0, foreach=True)
    h, c = torch.zeros(batch, hidden, device=dev), torch.zeros(batch, hidden, device=dev)
    rec.step("model and states")
    # Gradients accumulate over the batches; one optimizer step at the end.
    optimizer.zero_grad(set_to_none=True)
    for step in range(1, v.int("steps") + 1):
        if v.fix():
            h, c = h.detach(), c.detach()
        inputs = torch.randn(timesteps, batch, hidden // 2, device=dev)
        for t in range(timesteps):
            h, c = cell(inputs.select(0, t), h, c)
        loss = h.pow(2).mean()
        # The mistake's workaround for "backward through the graph a second time".
        loss.backward(retain_graph=not v.fix())
        rec.step(f"batch {step}")
        del loss, inputs
    optimizer.step()
    rec.step("optimizer.step()")


if __name__ == "__main__":
    common.main(globals())
