#!/usr/bin/env bash
# A role target named numa_kernel would run the collection's role numafleet.tuning.numa_kernel
# (ansible-test's generated play lists the target by its bare name, and the collection's roles
# are searched first), so this target runs its own play: setup_recorded_tree, then tasks/main.yml.
set -eux
ANSIBLE_ROLES_PATH=.. ansible-playbook -i ../../inventory -e "output_dir=${OUTPUT_DIR}" main.yml "$@"
