"""Parse torchtitan command lines with torchtitan's own ``ConfigManager``
(run as a script: it installs an import hook, so it runs in a process of its own).

    python tests/torchtitan_parse.py LINES.json    # a JSON list of argument lists

torchtitan is installed without its dependencies (the README's test section):
the modules its trainer imports for data loading, metrics and Triton kernels
(torchdata, tokenizers, datasets, tensorboard, its MoE kernels) are replaced by empty stand-ins, which
the parser never calls; the configuration classes, tyro and the validation in
their ``__post_init__`` are torchtitan's own. ``--module`` names this file's
``trainer_config`` (torchtitan's ``ConfigManager`` imports it by its dotted
path). Prints one JSON line per command line: the parsed settings, or the error.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import sys
import types

ABSENT = ("torchdata", "tokenizers", "datasets", "tensorboard", "torch.utils.tensorboard", "torchtitan.distributed.minimal_async_ep.kernels")


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules for :data:`ABSENT`: any attribute is a placeholder class."""

    def find_spec(self, name, path, target=None):
        if any(name == p or name.startswith(p + ".") for p in ABSENT):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__, module.__version__ = [], "0"

        def attribute(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {"__init__": lambda self, *a, **k: None})

        module.__getattr__ = attribute
        return module

    def exec_module(self, module):
        pass


def trainer_config():
    """torchtitan's trainer configuration with its defaults (the ``--config``)."""
    from torchtitan.trainer import Trainer

    return Trainer.Config()


def parse(line: list[str]) -> dict:
    from torchtitan.config.manager import ConfigManager

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            config = ConfigManager().parse_args(["--module", "torchtitan_parse", "--config", "trainer_config", *line])
    except SystemExit as e:
        return {"error": f"exit {e.code}: " + err.getvalue()[:1500]}
    except Exception as e:  # torchtitan's validation raises ValueError
        return {"error": f"{type(e).__name__}: {e}"}
    p = config.parallelism
    return {"parallelism": {k: getattr(p, k) for k in (
                "data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                "context_parallel_degree", "pipeline_parallel_degree", "pipeline_parallel_schedule",
                "fsdp_reshard_after_forward")},
            "activation_checkpoint": type(config.activation_checkpoint).__qualname__,
            "async_tp": config.compile.enable_async_tensor_parallel, "compile": config.compile.enable,
            "disable_cuda_graphs": config.training.disable_cuda_graphs}


def main() -> int:
    sys.meta_path.insert(0, _StandIns())
    sys.modules.setdefault("torchtitan_parse", sys.modules["__main__"])
    with open(sys.argv[1]) as f:
        lines = json.load(f)
    for line in lines:
        print(json.dumps(parse(line), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
