# cg_remote: the worker's client for the shared KV tier on Redis (worker/store/remote.c, DESIGN
# §16), on hiredis. Its own library so the tests and bench link it without the engine;
# cg_wstore links it for the worker.
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
add_library(cg_remote STATIC ${CMAKE_CURRENT_LIST_DIR}/remote.c)
target_link_libraries(cg_remote PUBLIC cg_base PkgConfig::HIREDIS Threads::Threads)
