# Dependencies from a relocatable prefix made by scripts/gpu-deps.sh (TRAINCTL_DEPS_DIR) instead of
# the system's: its CMake package configs, pkg-config files, protobuf and protoc.
get_filename_component(TRAINCTL_DEPS_DIR "${TRAINCTL_DEPS_DIR}" ABSOLUTE)
if(NOT EXISTS "${TRAINCTL_DEPS_DIR}/trainctl-deps.txt")
  message(FATAL_ERROR "TRAINCTL_DEPS_DIR=${TRAINCTL_DEPS_DIR}: not a folder made by "
                      "scripts/gpu-deps.sh (it has no trainctl-deps.txt)")
endif()
set(_deps_lib "${TRAINCTL_DEPS_DIR}/lib/${CMAKE_LIBRARY_ARCHITECTURE}")
if(NOT CMAKE_LIBRARY_ARCHITECTURE OR NOT IS_DIRECTORY "${_deps_lib}")
  message(FATAL_ERROR "TRAINCTL_DEPS_DIR=${TRAINCTL_DEPS_DIR} has no lib/${CMAKE_LIBRARY_ARCHITECTURE}")
endif()
list(PREPEND CMAKE_PREFIX_PATH "${TRAINCTL_DEPS_DIR}")
# pkg-config sees only the prefix's own .pc files.
set(ENV{PKG_CONFIG_PATH} "${_deps_lib}/pkgconfig")
set(ENV{PKG_CONFIG_LIBDIR} "${_deps_lib}/pkgconfig")
set(Protobuf_INCLUDE_DIR "${TRAINCTL_DEPS_DIR}/include" CACHE PATH "" FORCE)
set(Protobuf_LIBRARY "${_deps_lib}/libprotobuf.so" CACHE FILEPATH "" FORCE)
set(Protobuf_PROTOC_LIBRARY "${_deps_lib}/libprotoc.so" CACHE FILEPATH "" FORCE)
set(Protobuf_PROTOC_EXECUTABLE "${TRAINCTL_DEPS_DIR}/bin/protoc" CACHE FILEPATH "" FORCE)
# Ahead of every other include path: PyTorch's wheels carry protobuf 3.13 headers of their own in
# their include folder, which generated 3.21 code cannot use.
include_directories(BEFORE SYSTEM "${TRAINCTL_DEPS_DIR}/include")
# Binaries find the prefix's shared libraries at run time: in the build RPATH, as DT_RPATH rather
# than DT_RUNPATH, which would cover only direct dependencies (not libabsl_base's own).
list(APPEND CMAKE_BUILD_RPATH "${_deps_lib}")
add_link_options(-Wl,--disable-new-dtags)
message(STATUS "trainctl: dependencies from ${TRAINCTL_DEPS_DIR}")
