# The gateway's routing rule (server/workers.c: cg_route_pick), a unit suite, and the load that
# workers report to every gateway replica, with real workers and gateways.
cg_check_test(NAME test_routing SOURCES test_routing.c LIBS cg_server
              PROGRAMS chunkgate chunkgate-worker)
# Three gateways behind nginx (Debian nginx-light), two workers and one Redis (DESIGN §18): the
# hit rate of one gateway, kill -9 of a replica under load, a new replica's first request
# (exit 77 = skipped without redis-server or nginx).
cg_check_test(NAME test_replicas SOURCES test_replicas.c LIBS cg_test_redis PkgConfig::CURL
              TIMEOUT 400 PROGRAMS chunkgate chunkgate-worker)
set_tests_properties(test_replicas PROPERTIES SKIP_RETURN_CODE 77)
