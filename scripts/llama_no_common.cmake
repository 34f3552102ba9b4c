# Included by CMake at the end of llama.cpp's own project() call when tokenq builds the
# llama-cpp-python wheel (-DCMAKE_PROJECT_llama.cpp_INCLUDE=<this file>, passed by
# scripts/setup.sh and scripts/llama_portable.sh).
#
# llama-cpp-python forces llama.cpp's `common` library on for its multimodal library
# (mtmd). tokenq builds without mtmd (LLAVA_BUILD=OFF) and never loads `common`, whose
# ~50 C++ files are ~3.7 of a portable build's ~14 minutes on 2 cores. This runs after
# that forced setting and before llama.cpp reads it. llama-server (cli/build_llama_server.sh)
# needs `common` and does not use this file.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
