# The Debian package: `cpack -G DEB` in build/default (after the build) writes
# trainctl_<version>_<arch>.deb with the four binaries in /usr/bin, the systemd units, the
# sysusers.d/tmpfiles.d snippets, /etc/trainctl/*.env (conffiles), the README and docs/. Depends comes
# from the binaries' shared libraries (dpkg-shlibdeps, Debian's dpkg-dev). docs/deploy.md.
#
# The install rules exist for this package only: paths are relative to "/" (packaging prefix), so
# they are the paths on the node.
install(TARGETS trainctl trainctl-coordinator trainctl-worker trainctl-trainer
        RUNTIME DESTINATION usr/bin)
install(FILES deploy/systemd/trainctl-coordinator.service deploy/systemd/trainctl-worker.service
        DESTINATION lib/systemd/system)
install(FILES deploy/systemd/trainctl.sysusers DESTINATION usr/lib/sysusers.d RENAME trainctl.conf)
install(FILES deploy/systemd/trainctl.tmpfiles DESTINATION usr/lib/tmpfiles.d RENAME trainctl.conf)
install(FILES deploy/etc/coordinator.env deploy/etc/worker.env DESTINATION etc/trainctl)
install(FILES README.md DESTINATION usr/share/doc/trainctl)
# The README links its topic pages as docs/*.md: the same layout beside it.
install(DIRECTORY docs/ DESTINATION usr/share/doc/trainctl/docs FILES_MATCHING PATTERN "*.md")

# cpack only packages what is built: its preinstall step must not build everything (outside
# /work/bld.sh's lock, with its own parallelism).
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME trainctl)
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_CONTACT "trainctl maintainers <trainctl@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "multimodal LLM training control plane (coordinator, worker daemons, ZeRO-3 trainer, CLI)")
set(CPACK_PACKAGE_DESCRIPTION
    "trainctl schedules distillation, SFT, GRPO and eval jobs for Qwen2-VL models onto per-node \
worker daemons that run a LibTorch ZeRO-3 trainer. Ships trainctl, trainctl-coordinator, \
trainctl-worker and trainctl-trainer, with systemd units (Type=notify, watchdog).")
set(CPACK_PACKAGING_INSTALL_PREFIX "/")
set(CPACK_STRIP_FILES ON)  # the package ships no symbol tables, whatever the build type
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # trainctl_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS OFF)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd")
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
# postinst: the user and directories (systemd-sysusers, systemd-tmpfiles), daemon-reload; prerm
# stops the units on removal. conffiles: the /etc/trainctl settings survive upgrades.
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${PROJECT_SOURCE_DIR}/deploy/debian/postinst;${PROJECT_SOURCE_DIR}/deploy/debian/prerm;${PROJECT_SOURCE_DIR}/deploy/debian/postrm;${PROJECT_SOURCE_DIR}/deploy/debian/conffiles")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
