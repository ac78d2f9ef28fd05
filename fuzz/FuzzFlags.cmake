# KVTRIM_FUZZ=ON: checks the build fits libFuzzer (Clang, CPU only, no tests or benchmarks)
# and instruments every target of the project for it: AddressSanitizer, UndefinedBehavior-
# Sanitizer and libFuzzer's coverage (fuzzer-no-link), so that coverage reaches the parsers
# in the project's libraries. The fuzz targets themselves link libFuzzer (fuzz/CMakeLists.txt).
# Included by the top-level CMakeLists.txt before its subdirectories.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "KVTRIM_FUZZ=ON needs Clang (libFuzzer): configure with "
                      "CC=clang CXX=clang++; got ${CMAKE_CXX_COMPILER_ID}")
endif()
if(KVTRIM_WITH_CUDA)
  message(FATAL_ERROR "KVTRIM_FUZZ=ON builds the CPU backend only: add -DKVTRIM_CUDA=OFF")
endif()
if(KVTRIM_BUILD_TESTS OR KVTRIM_BUILD_BENCHMARKS)
  message(FATAL_ERROR "KVTRIM_FUZZ=ON builds no tests or benchmarks: add "
                      "-DKVTRIM_BUILD_TESTS=OFF -DKVTRIM_BUILD_BENCHMARKS=OFF")
endif()
# Every UBSan finding is an error (no recovery), so a fuzzer stops on it like on a crash.
set(KVTRIM_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all
                          -fno-omit-frame-pointer)
add_compile_options(-fsanitize=fuzzer-no-link ${KVTRIM_SANITIZE_FLAGS})
add_link_options(${KVTRIM_SANITIZE_FLAGS})
message(STATUS "kvtrim: fuzzing build (libFuzzer, ASan, UBSan)")
