# The CUDA build (TRAINCTL_CUDA): checks the LibTorch found is a CUDA 2.x one and finds NCCL's
# header, which c10d's ProcessGroupNCCL.hpp includes. Sets TRAINCTL_CUDA_DEFINITIONS and
# TRAINCTL_NCCL_INCLUDE_DIR for the trainer's targets.
if(Torch_VERSION VERSION_LESS 2.0 AND NOT TRAINCTL_CUDA_CONFIGURE_CHECK)
  message(FATAL_ERROR "TRAINCTL_CUDA needs LibTorch >= 2.0; ${Torch_DIR} is ${Torch_VERSION}")
endif()
set(TRAINCTL_TORCH_HAS_CUDA OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(TRAINCTL_TORCH_HAS_CUDA ON)
endif()
if(NOT TRAINCTL_TORCH_HAS_CUDA AND NOT TRAINCTL_CUDA_CONFIGURE_CHECK)
  message(FATAL_ERROR "TRAINCTL_CUDA: the LibTorch at ${Torch_DIR} was built without CUDA; point "
                      "Torch_DIR at a CUDA one (python3 -c 'import torch; "
                      "print(torch.utils.cmake_prefix_path)')")
endif()

set(TRAINCTL_CUDA_DEFINITIONS TRAINCTL_CUDA_BUILD=1)
if(TRAINCTL_TORCH_HAS_CUDA)
  # NCCL's header: the nvidia-nccl wheel beside torch's, NCCL_HOME, the CUDA toolkit, or the
  # copy scripts/gpu-deps.sh gathered.
  get_filename_component(_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  find_path(TRAINCTL_NCCL_INCLUDE_DIR nccl.h
    HINTS "${_site}/nvidia/nccl/include" "$ENV{NCCL_HOME}/include" "${CUDAToolkit_INCLUDE_DIRS}"
          /usr/local/cuda/include "${TRAINCTL_DEPS_DIR}/include/nccl"
    NO_DEFAULT_PATH)
  if(NOT TRAINCTL_NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "TRAINCTL_CUDA: nccl.h not found (set NCCL_HOME, or run scripts/gpu-deps.sh "
                        "on a machine with the CUDA toolkit)")
  endif()
  message(STATUS "trainctl: CUDA LibTorch ${Torch_VERSION}, NCCL header in ${TRAINCTL_NCCL_INCLUDE_DIR}")
else()
  message(STATUS "trainctl: TRAINCTL_CUDA layout against LibTorch ${Torch_VERSION} without CUDA "
                 "(configure check only)")
endif()

# nvcc, for the fused kernels (worker/trainer/model/cuda/): required by a real CUDA build (whose
# LibTorch has usually enabled CUDA already); the configure check builds the kernels wherever it
# finds one (CMAKE_CUDA_COMPILER, CUDACXX or PATH), which is how CPU CI compiles them
# (tests/gpu/deps_test.sh), and goes without them elsewhere. nvcc's host compiler is its default
# (g++ on Debian 12: GCC 12, which CUDA 12 and 13 support); CUDAHOSTCXX changes it.
include(CheckLanguage)
check_language(CUDA)
set(TRAINCTL_FUSED_KERNELS OFF)
if(CMAKE_CUDA_COMPILER)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(TRAINCTL_FUSED_KERNELS ON)
  # H100/H200 (sm_90, with its PTX for newer GPUs to JIT) and A100 (sm_80).
  set(TRAINCTL_CUDA_ARCHITECTURES "80-real;90" CACHE STRING "CUDA_ARCHITECTURES of the fused kernels")
  if(CCACHE_PROGRAM)
    set(CMAKE_CUDA_COMPILER_LAUNCHER "${CCACHE_PROGRAM}")
  endif()
  message(STATUS "trainctl: fused kernels with ${CMAKE_CUDA_COMPILER} "
                 "(CUDA ${CMAKE_CUDA_COMPILER_VERSION}) for ${TRAINCTL_CUDA_ARCHITECTURES}")
elseif(TRAINCTL_TORCH_HAS_CUDA)
  message(FATAL_ERROR "TRAINCTL_CUDA: nvcc not found for the fused kernels (put the CUDA "
                      "toolkit's bin on PATH, or set CMAKE_CUDA_COMPILER)")
else()
  message(STATUS "trainctl: no nvcc, so no fused kernels (configure check only)")
endif()
