"""Writes tests/data/torch/*.onnx: what torch.onnx.export really writes, with both exporters,
for the models tests/onnx/test_onnx_torch.py imports, and the outputs torch computed for a fixed
input (<name>.npz: x, y). The files are committed so the import of real exporter output is
checked where torch is not installed (it is not in the test extra: a CUDA-enabled torch wheel
is gigabytes); where torch and onnxscript are installed the same test also exports live.

    python tests/data/make_torch_exports.py      (needs torch and onnxscript: pip install torch 'fastpath[torch-export]')
"""
from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch")


def models():
    """(name, module, n_in) for each model: every activation, BatchNorm after Linear (folded
    on import), one regression output, a 3-class softmax classifier."""
    import torch
    from torch import nn
    torch.manual_seed(7)
    acts = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 9), nn.Tanh(),
                         nn.Linear(9, 5), nn.Sigmoid(), nn.Linear(5, 2))
    bn = nn.Sequential(nn.Linear(10, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Linear(24, 12),
                       nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, 2))
    # running statistics far from (0, 1), as after training, so a dropped BatchNorm is visible
    with torch.no_grad():
        for m in bn:
            if isinstance(m, nn.BatchNorm1d):
                m.running_mean.uniform_(-1.5, 1.5)
                m.running_var.uniform_(0.3, 4.0)
                m.weight.uniform_(0.5, 2.0)
                m.bias.uniform_(-0.5, 0.5)
    reg = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    cls3 = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3), nn.Softmax(dim=-1))
    return [("acts", acts.eval(), 12), ("batchnorm", bn.eval(), 10), ("regression", reg.eval(), 8),
            ("softmax3", cls3.eval(), 8)]


def export(net, n_in: int, path: str, dynamo: bool) -> None:
    import torch
    kw = {"dynamo": dynamo}
    if not dynamo:
        kw["dynamic_axes"] = {"x": {0: "batch"}, "y": {0: "batch"}}
    else:
        # a batch dimension that is not fixed to 1, as users export for batch scoring
        kw["dynamic_shapes"] = ({0: torch.export.Dim("batch")},)
    torch.onnx.export(net, (torch.zeros(2, n_in),), path, input_names=["x"], output_names=["y"], **kw)


def main() -> int:
    import torch
    os.makedirs(HERE, exist_ok=True)
    for name, net, n_in in models():
        x = np.random.default_rng(3).standard_normal((32, n_in)).astype(np.float32) * 1.5
        with torch.no_grad():
            y = net(torch.from_numpy(x)).numpy()
        np.savez(os.path.join(HERE, f"{name}.npz"), x=x, y=y)
        for dynamo in (False, True):
            p = os.path.join(HERE, f"{name}-{'dynamo' if dynamo else 'torchscript'}.onnx")
            export(net, n_in, p, dynamo)
            # the dynamo exporter may write weights beside the graph; keep one self-contained file
            import onnx
            m = onnx.load(p)
            onnx.save_model(m, p, save_as_external_data=False)
            for extra in (p + ".data",):
                if os.path.exists(extra):
                    os.remove(extra)
            print(p, os.path.getsize(p), "bytes")
    print("torch", torch.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
