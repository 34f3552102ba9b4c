#!/usr/bin/env bash
# Print CMAKE_ARGS for building llama.cpp (llama-cpp-python, llama-server) on this CPU.
# GGML_NATIVE builds die with SIGILL in the AMX path on these VMs, so we turn
# native off and enable exactly the ISA extensions /proc/cpuinfo reports.
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }
args="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
has avx2 && args+=" -DGGML_AVX2=ON"
has fma && args+=" -DGGML_FMA=ON"
has f16c && args+=" -DGGML_F16C=ON"
has avx512f && args+=" -DGGML_AVX512=ON"
has avx512_vnni && args+=" -DGGML_AVX512_VNNI=ON"
has avx512_bf16 && args+=" -DGGML_AVX512_BF16=ON"
has avx512vbmi && args+=" -DGGML_AVX512_VBMI=ON"
echo "$args"
