#!/usr/bin/env bash
# Fetch the wheels a GPU machine without a package index needs to execute and test the labs (the
# Jupyter/nbval stack, jupytext, pandas, pytest-timeout, pytest-xdist) into .whl/ (git-ignored), for Python 3.12 on
# x86-64 Linux. Run it on a machine with pip, from anywhere in the checkout:
#
#   tools/fetch-wheels.sh [EXTRA_PACKAGE ...]
#
# Then copy the checkout, .whl/ included, to the GPU machine: tools/gpu_session.sh installs the wheels
# offline before it runs anything. A GPU image already has torch, numpy, matplotlib, pytest and the
# like; those wheels are removed again, so that the image's own builds (CUDA torch above all) stay in
# charge. On a GPU machine with a package index none of this is needed: pip install -r requirements.txt.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
rm -rf .whl && mkdir .whl
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d .whl nbval nbclient nbconvert nbformat ipykernel ipywidgets jupytext pandas pytest-timeout pytest-xdist "$@"
# what a GPU image with PyTorch already provides: keep its versions
for p in pytest pluggy iniconfig packaging psutil typing_extensions pygments python_dateutil attrs \
         coverage tzdata numpy torch matplotlib pillow cloudpickle tqdm pyyaml six; do
  rm -f .whl/"${p}"-[0-9]*.whl
done
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/. On the GPU machine (with .whl/ copied along):"
echo "  tools/gpu_session.sh --tests --bench --out DIR     # installs them offline, then runs the labs"
