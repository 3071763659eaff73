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
