# Disk tier benchmark: restore vs sequential pread, spill vs sequential pwrite, same run.
add_executable(bench_disk bench_disk.c)
target_link_libraries(bench_disk PRIVATE cg_wserve)
