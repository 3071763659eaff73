# The fuzz build (TRAINCTL_FUZZ, the `fuzz` preset): the parsers' libraries and the libFuzzer
# targets of tests/fuzz, with clang. Everything is compiled with libFuzzer's coverage
# instrumentation plus ASan and UBSan (UB aborts, so the fuzzer sees it as a crash); only the
# harnesses get -fsanitize=fuzzer, which brings libFuzzer's main(). Included from the top-level
# CMakeLists.txt, which returns after it: no LibTorch, no daemons, no GoogleTest here.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "TRAINCTL_FUZZ needs clang (libFuzzer); configure with the `fuzz` preset")
endif()

set(TRAINCTL_SANITIZERS -fsanitize=address,undefined -fno-sanitize-recover=all)
add_compile_options(-O1 -gline-tables-only -fno-omit-frame-pointer -fsanitize=fuzzer-no-link
                    ${TRAINCTL_SANITIZERS})
add_link_options(${TRAINCTL_SANITIZERS})

# clang's warnings differ from GCC's (it lacks -Wshadow=local): shown, not fatal, so that the
# fuzz build never fails on a warning the default (GCC, -Werror) build does not have.
function(trainctl_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
endfunction()

add_subdirectory(proto)
# Except the generated messages: protoc's code, whose parsing is libprotobuf's (itself not
# instrumented), compiled without sanitizers or coverage. They were a fifth of the fuzz build's
# CPU time (job.pb.cc alone 25 s instrumented, 10 s without).
target_compile_options(trainctl_proto PRIVATE -fno-sanitize=all)
add_subdirectory(common)
add_subdirectory(common/tokenizer)
add_subdirectory(common/data)
add_subdirectory(worker/trainer/model)  # the torch-free safetensors header parser only
add_subdirectory(tests/fuzz)
