# Fuzz targets (tests/fuzz/fuzz_<target>.c). Every build replays each target's seed corpus
# (tests/fuzz/corpus/<target>/) through tests/fuzz/replay_main.c as a ctest test, so gcc builds
# check the corpora without clang. With -DCG_FUZZ=ON (clang only; scripts/fuzz.sh configures it)
# the libFuzzer binaries fuzz_<target> are built as well.
option(CG_FUZZ "Build the libFuzzer targets in tests/fuzz (clang; see scripts/fuzz.sh)" OFF)

set(CG_FUZZ_TARGETS split chat sse json_request safetensors config kvwire disk chat_template
    http_frame gguf)
set(CG_FUZZ_LIBS_split cg_cache)
set(CG_FUZZ_LIBS_chat cg_cache)
set(CG_FUZZ_LIBS_sse cg_backends)
set(CG_FUZZ_LIBS_json_request cg_server)
set(CG_FUZZ_LIBS_safetensors cg_wserve)
set(CG_FUZZ_LIBS_config cg_wserve)
set(CG_FUZZ_LIBS_kvwire cg_kv)
set(CG_FUZZ_LIBS_disk cg_wserve)
set(CG_FUZZ_LIBS_chat_template cg_cache)
set(CG_FUZZ_LIBS_http_frame cg_base)
set(CG_FUZZ_LIBS_gguf cg_wserve)

if(CG_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CG_FUZZ=ON needs clang (libFuzzer): configure with CC=clang")
  endif()
  if(NOT CMAKE_C_FLAGS MATCHES "fuzzer-no-link")
    message(WARNING "CG_FUZZ=ON without -fsanitize=fuzzer-no-link in CMAKE_C_FLAGS: the "
                    "libraries under test get no coverage feedback (use scripts/fuzz.sh)")
  endif()
endif()

foreach(t ${CG_FUZZ_TARGETS})
  set(src ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_${t}.c)
  add_executable(fuzz_replay_${t} ${src} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/replay_main.c)
  target_link_libraries(fuzz_replay_${t} PRIVATE ${CG_FUZZ_LIBS_${t}} Threads::Threads)
  add_test(NAME fuzz_corpus_${t}
           COMMAND fuzz_replay_${t} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/${t})
  set_tests_properties(fuzz_corpus_${t} PROPERTIES TIMEOUT 300 LABELS fuzz)
  if(CG_FUZZ)
    add_executable(fuzz_${t} ${src})
    target_compile_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(fuzz_${t} PRIVATE ${CG_FUZZ_LIBS_${t}} Threads::Threads)
    target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
  endif()
endforeach()
