"""What every ``chital`` subcommand shares: finding and loading the configuration."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .config import Config, ConfigError, load_config

DEFAULT_CONFIG = "config.yaml"


def config_path(arg: str | None) -> Path | None:
    if arg:
        return Path(arg)
    env = os.environ.get("CHITAL_CONFIG")
    if env:
        return Path(env)
    return Path(DEFAULT_CONFIG) if Path(DEFAULT_CONFIG).exists() else None


def load_config_arg(args: argparse.Namespace) -> Config:
    path = config_path(args.config)
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"chital: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
