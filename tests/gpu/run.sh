#!/usr/bin/env bash
# GPU check of kvsidecar's CUDA transfer backend (see drive_cuda.py).
#
# On a machine WITH an NVIDIA GPU and PyTorch (no network needed):
#   tests/gpu/run.sh [drive_cuda.py options]
#     binary: $KVSIDECAR_BIN, else ./build*/kvsidecar, else built here when
#     cmake and the build dependencies exist (build-gpu-check/).
#     results: $OUT (or ./gpu_check_out): sidecar.log, gpu_check.json.
#
# On the build machine, to carry a binary to a GPU machine that lacks the
# build's shared libraries:
#   tests/gpu/run.sh bundle DIR
#     copies the binary and every non-glibc shared library it links into
#     DIR and DIR/lib; on the GPU machine run KVSIDECAR_BIN=DIR/kvsidecar
#     tests/gpu/run.sh (DIR/lib is put on LD_LIBRARY_PATH automatically).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

find_binary() {
  if [[ -n "${KVSIDECAR_BIN:-}" ]]; then
    echo "$KVSIDECAR_BIN"
    return
  fi
  local b
  for b in "$root"/build/kvsidecar "$root"/build-*/kvsidecar; do
    if [[ -x "$b" ]]; then
      echo "$b"
      return
    fi
  done
  echo ""
}

bundle() {
  local dir="$1" bin
  bin="$(find_binary)"
  [[ -x "$bin" ]] || { echo "bundle: no kvsidecar binary (set KVSIDECAR_BIN)" >&2; exit 2; }
  mkdir -p "$dir/lib"
  cp -L "$bin" "$dir/kvsidecar"
  # Everything ldd resolves except glibc itself and the loader; the CUDA
  # driver (libcuda) must come from the GPU machine and is never linked.
  ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libcuda.so*) ;;
      *) cp -L "$lib" "$dir/lib/" ;;
    esac
  done
  echo "bundled $(basename "$bin") and $(find "$dir/lib" -type f | wc -l) libraries into $dir"
}

if [[ "${1:-}" == "bundle" ]]; then
  [[ -n "${2:-}" ]] || { echo "usage: $0 bundle DIR" >&2; exit 2; }
  bundle "$2"
  exit 0
fi

bin="$(find_binary)"
if [[ -z "$bin" ]]; then
  if command -v cmake >/dev/null 2>&1; then
    echo "== no kvsidecar binary: building one in $root/build-gpu-check"
    gen=()
    command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    cmake -S "$root" -B "$root/build-gpu-check" "${gen[@]}" -DKVSIDECAR_BENCH=OFF -DKVSIDECAR_CUDA=ON
    cmake --build "$root/build-gpu-check" --target kvsidecar -j "$(nproc)"
    bin="$root/build-gpu-check/kvsidecar"
  else
    echo "no kvsidecar binary: set KVSIDECAR_BIN (or carry one made with '$0 bundle DIR')" >&2
    exit 2
  fi
fi
[[ -x "$bin" ]] || { echo "not executable: $bin" >&2; exit 2; }

# A bundled binary brings its libraries in <dir>/lib.
libdir="$(cd "$(dirname "$bin")" && pwd)/lib"
if [[ -d "$libdir" ]]; then
  export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if ldd "$bin" 2>/dev/null | grep -q "not found"; then
  echo "kvsidecar is missing shared libraries on this machine:" >&2
  ldd "$bin" | grep "not found" >&2
  echo "carry a bundle made on the build machine with: $0 bundle DIR" >&2
  exit 2
fi

if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L || true; fi
python3 - <<'EOF' || { echo "this check needs PyTorch with a visible CUDA device" >&2; exit 2; }
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name(0)}")
EOF

out="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$out"
echo "== kvsidecar: $bin"
echo "== results: $out"
set +e
timeout -k 10 460 python3 "$here/drive_cuda.py" --bin "$bin" --out "$out" "$@"
status=$?
set -e
[[ $status -eq 124 ]] && echo "drive_cuda.py ran out of time" >&2
exit $status
