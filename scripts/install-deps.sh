#!/usr/bin/env bash
# Installs every Debian package that dtrain's build, tests and quick start need.
# Idempotent: packages already present are skipped; nothing is downloaded from
# anywhere but Debian's archive.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git
  clang clang-format libclang-rt-14-dev
  libyaml-cpp-dev libcli11-dev libfmt-dev doctest-dev nlohmann-json3-dev
  libdnnl-dev ocl-icd-opencl-dev zlib1g-dev
  libpng-dev libjpeg-dev  # dtrain predict reads PNG and JPEG images
  libopenmpi-dev openmpi-bin
  slurmctld slurmd slurm-client  # a real one-node SLURM for tests/slurm (srun --mpi=pmix)
  dataset-fashion-mnist
  fortunes  # ~2.6 MB of English text: the corpus for `dtrain data tokenize`
  python3-venv  # test helpers only: the TensorBoard reader from PyPI (tests/scripts)
  chromium      # test helper only: renders the run report headless (tests/scripts)
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
