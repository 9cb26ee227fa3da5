# Checks that each source folder includes only the folders below it, so the
# libraries form a tree without cycles:
#   log, core, msgpack        (leaves)
#   cache                     core
#   events_wire               core msgpack
#   lmcache_wire              core cache msgpack
#   messages                  core cache events_wire lmcache_wire
#   relay                     core msgpack events_wire messages
#   config, l2                core log
#   gpu                       core log messages
#   metrics                   core log messages
#   http                      core log messages metrics
#   lmcache_grpc              core msgpack lmcache_wire messages
#   actors                    everything above except metrics, http and
#                             admin (the shared
#                             actor helpers: interfaces, bridge base, ZAP)
#   actors/relay              actors and everything it may include
#   actors/cache              actors and everything it may include
#                             (relay and cache actors never include each other)
#   admin                     what actors may, actors, metrics, http
#                             (LMCache's HTTP API: routes and backend)
#   app                       everything
# Run: cmake -DSRC=<repo> -P tests/layering.cmake (ctest: layering).
cmake_minimum_required(VERSION 3.20)
set(allowed_log "log")
set(allowed_core "core")
set(allowed_msgpack "msgpack")
set(allowed_cache "core;cache")
set(allowed_events_wire "core;msgpack;events_wire")
set(allowed_lmcache_wire "core;cache;msgpack;lmcache_wire")
set(allowed_messages "core;cache;events_wire;lmcache_wire;messages")
set(allowed_relay "core;msgpack;events_wire;messages;relay")
set(allowed_config "core;log;config")
set(allowed_l2 "core;log;l2")
set(allowed_gpu "core;log;messages;gpu")
set(allowed_metrics "core;log;messages;metrics")
set(allowed_http "core;log;messages;metrics;http")
set(allowed_lmcache_grpc "core;cache;msgpack;lmcache_wire;messages;lmcache_grpc")
set(allowed_actors "core;log;msgpack;cache;events_wire;lmcache_wire;messages;relay;config;l2;gpu;lmcache_grpc;actors")
set(allowed_actors_relay "${allowed_actors};actors/relay")
set(allowed_actors_cache "${allowed_actors};actors/cache")
set(allowed_admin "${allowed_actors};metrics;http;admin")
set(allowed_app "core;log;msgpack;cache;events_wire;lmcache_wire;messages;relay;config;l2;gpu;metrics;http;admin;lmcache_grpc;actors;actors/relay;actors/cache;app")

set(violations "")
foreach(folder log core msgpack cache events_wire lmcache_wire messages relay config l2 gpu metrics http admin lmcache_grpc actors actors/relay actors/cache app)
  string(REPLACE "/" "_" var "${folder}")
  file(GLOB files ${SRC}/${folder}/*.hpp ${SRC}/${folder}/*.cpp ${SRC}/${folder}/*.cu)
  foreach(f ${files})
    file(STRINGS ${f} lines REGEX "^#include \"[a-z0-9_]+/")
    foreach(line ${lines})
      # actors/relay/x.hpp and actors/cache/x.hpp are folders of their own.
      if(line MATCHES "^#include \"actors/(relay|cache)/")
        string(REGEX REPLACE "^#include \"(actors/[a-z]+)/.*" "\\1" dep "${line}")
      else()
        string(REGEX REPLACE "^#include \"([a-z0-9_]+)/.*" "\\1" dep "${line}")
      endif()
      if(NOT dep IN_LIST allowed_${var})
        file(RELATIVE_PATH rel ${SRC} ${f})
        string(APPEND violations "\n  ${rel}: ${line} (${folder}/ may include only: ${allowed_${var}})")
      endif()
    endforeach()
  endforeach()
endforeach()
if(violations)
  message(FATAL_ERROR "include layering broken:${violations}")
endif()
message(STATUS "include layering ok")
