# Helpers every component uses, so a new component adds no lines outside its own folder.

# -Wno-restrict: g++ 12 reports false positives inside libstdc++'s string code at -O2 (GCC PR105651).
set(FATHOM_WARNINGS -Wall -Wextra -Werror -Wno-missing-field-initializers
    $<$<CXX_COMPILER_ID:GNU>:-Wno-restrict>)

# ISA flags per source-file suffix: foo_avx512.cpp, foo_avx512bf16.cpp, foo_avx512fp16.cpp (BF16 and
# FP16), foo_avx2.cpp, foo_sse42.cpp.
# The shipped binary is generic x86-64; only these files use wider instructions, and callers pick
# them at run time from base/cpu.h.
set(FATHOM_FLAGS_AVX2 -mavx2 -mfma -mf16c)
# -Wno-uninitialized: g++ 12's _mm512_reduce_* macros trip it (GCC PR105593).
set(FATHOM_FLAGS_AVX512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mavx512vnni
    -Wno-uninitialized)
set(FATHOM_FLAGS_AVX512BF16 ${FATHOM_FLAGS_AVX512} -mavx512bf16)
set(FATHOM_FLAGS_AVX512FP16 ${FATHOM_FLAGS_AVX512BF16} -mavx512fp16)

function(fathom_isa_flags)
  foreach(src ${ARGN})
    get_filename_component(stem ${src} NAME_WE)
    if(stem MATCHES "_avx512bf16$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${FATHOM_FLAGS_AVX512BF16}")
    elseif(stem MATCHES "_avx512fp16$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${FATHOM_FLAGS_AVX512FP16}")
    elseif(stem MATCHES "_avx512$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${FATHOM_FLAGS_AVX512}")
    elseif(stem MATCHES "_avx2$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${FATHOM_FLAGS_AVX2}")
    elseif(stem MATCHES "_sse42$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "-msse4.2;-mpclmul")
    endif()
  endforeach()
endfunction()

# fathom_library(NAME name SOURCES ... DEPS ...): a component library fathom_<name> built from the
# folder's non-test, non-fuzz sources unless SOURCES is given.
function(fathom_library)
  cmake_parse_arguments(A "" "NAME" "SOURCES;DEPS" ${ARGN})
  if(NOT A_SOURCES)
    file(GLOB A_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
    list(FILTER A_SOURCES EXCLUDE REGEX "(_test|_fuzz)\\.cpp$")
  endif()
  set(target fathom_${A_NAME})
  add_library(${target} STATIC ${A_SOURCES})
  fathom_isa_flags(${A_SOURCES})
  target_include_directories(${target} PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(${target} PRIVATE ${FATHOM_WARNINGS})
  target_link_libraries(${target} PUBLIC ${A_DEPS})
  set_property(GLOBAL APPEND PROPERTY FATHOM_LIBRARIES ${target})
endfunction()

# fathom_tests(NAME name DEPS ... [LABELS ...] [SOURCES ...]): one gtest binary per component from
# its *_test.cpp files; each TEST becomes a ctest entry (labels: unit by default).
function(fathom_tests)
  if(NOT FATHOM_TESTS)
    return()
  endif()
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT A_SOURCES)
    file(GLOB A_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*_test.cpp)
  endif()
  if(NOT A_SOURCES)
    return()
  endif()
  if(NOT A_LABELS)
    set(A_LABELS unit)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  set(target ${A_NAME}_test)
  add_executable(${target} ${A_SOURCES} ${CMAKE_SOURCE_DIR}/cmake/test_env.cpp)
  fathom_isa_flags(${A_SOURCES})
  target_compile_options(${target} PRIVATE ${FATHOM_WARNINGS})
  target_compile_definitions(${target} PRIVATE FATHOM_TEST_BIN="${CMAKE_BINARY_DIR}/bin/fathom"
                                               FATHOM_TEST_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  target_link_libraries(${target} PRIVATE ${A_DEPS} GTest::gtest GTest::gtest_main)
  # FATHOM_BIN and FATHOM_SOURCE_DIR come from cmake/test_env.cpp (a list here would be split).
  gtest_discover_tests(${target} DISCOVERY_MODE PRE_TEST PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT})
endfunction()

# fathom_fuzzer(NAME name SOURCE files... DEPS ...): a libFuzzer target, built only with FATHOM_FUZZ;
# ctest runs it for FATHOM_FUZZ_SECONDS under the "fuzz" label.
set(FATHOM_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzz target runs under ctest")
function(fathom_fuzzer)
  if(NOT FATHOM_FUZZ)
    return()
  endif()
  cmake_parse_arguments(A "" "NAME;CORPUS" "SOURCE;DEPS" ${ARGN})
  set(target fuzz_${A_NAME})
  add_executable(${target} ${A_SOURCE})
  target_compile_options(${target} PRIVATE -fsanitize=fuzzer,address,undefined ${FATHOM_WARNINGS})
  target_link_options(${target} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(${target} PRIVATE ${A_DEPS})
  set(corpus_dir ${CMAKE_BINARY_DIR}/fuzz-corpus/${A_NAME})
  file(MAKE_DIRECTORY ${corpus_dir})
  set(seed_args "")
  if(A_CORPUS)
    set(seed_args ${A_CORPUS})
  endif()
  add_test(NAME fuzz.${A_NAME}
    COMMAND ${target} -max_total_time=${FATHOM_FUZZ_SECONDS} -rss_limit_mb=4096 -timeout=10
            -print_final_stats=1 ${corpus_dir} ${seed_args})
  set_tests_properties(fuzz.${A_NAME} PROPERTIES LABELS fuzz TIMEOUT 3600)
  set_property(GLOBAL APPEND PROPERTY FATHOM_FUZZERS ${target})
endfunction()
