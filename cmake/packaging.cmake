# Install rules and the Debian package (CPack DEB).
#
#   cmake --install build [--prefix /usr]    binary to <prefix>/bin, default config
#                                            to KVSIDECAR_CONFIG_DIR/kvsidecar.toml
#   cd build && cpack -G DEB                 kvsidecar_<version>_<arch>.deb
#
# The config goes to an absolute directory (/etc/kvsidecar) whatever the
# prefix, as Debian wants; DESTDIR=<root> cmake --install ... stages it all
# under <root> without root rights.
include(GNUInstallDirs)

set(KVSIDECAR_CONFIG_DIR "/etc/kvsidecar" CACHE PATH "Where the default config is installed")

install(TARGETS kvsidecar RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT kvsidecar)
install(FILES ${CMAKE_SOURCE_DIR}/config/default.toml
        DESTINATION ${KVSIDECAR_CONFIG_DIR} RENAME kvsidecar.toml COMPONENT kvsidecar)
install(FILES ${CMAKE_SOURCE_DIR}/deploy/systemd/kvsidecar.service
        DESTINATION /lib/systemd/system COMPONENT kvsidecar)

set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "kvsidecar")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "kvsidecar maintainers <kvsidecar@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "KV-cache sidecar for LLM engines: KV event relay and LMCache-compatible cache server")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "net")
# Runtime libraries computed from the binary (dpkg-shlibdeps): CAF, ZeroMQ,
# spdlog, fmt, xxhash, prometheus-cpp (core), hiredis.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The config is the admin's after installation: upgrades keep their edits.
set(KVS_CONFFILES ${CMAKE_BINARY_DIR}/deb/conffiles)
file(WRITE ${KVS_CONFFILES} "${KVSIDECAR_CONFIG_DIR}/kvsidecar.toml\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${KVS_CONFFILES})
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
