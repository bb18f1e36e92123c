#!/usr/bin/env bash
# `make run`: the main job. Until the serving issue lands this prints the CLI's help; it will
# then start `fathom serve` on the built-in default model.
set -euo pipefail
cd "$(dirname "$0")/.."
./build/bin/fathom --help
