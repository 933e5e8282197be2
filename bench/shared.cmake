# Shared KV tier on Redis: restore into the worker vs a plain GET of the same bytes, and TTFT
# cold / warm from RAM / warm from the remote tier, in one run (starts its own redis-server).
if(TARGET cg_remote)
  add_executable(bench_shared bench_shared.c)
  target_link_libraries(bench_shared PRIVATE cg_test_engine)
endif()
