"""Hydra entry point: compose the config and hand it to runners.run. Nothing else.

    python run.py method=tidal task=niah model=llama3 method.budget=256
    python run.py -m method=quest,tidal method.budget=256,512 hydra/launcher=slurm
"""
import sys

import hydra

from runners import cli, run as run_module


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg):
    return run_module.run(cfg)   # the summary: a sweep's table reads it (runners/sweep.py)


if __name__ == "__main__":
    cli.prevalidate(sys.argv[1:])  # bad input: one line, exit code 2, before anything loads
    main()
