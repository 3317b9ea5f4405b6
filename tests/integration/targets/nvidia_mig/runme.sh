#!/usr/bin/env bash
# A role target named nvidia_mig would run the collection's role numafleet.tuning.nvidia_mig
# (ansible-test's generated play lists the target by its bare name, and the collection's roles
# are searched first), so this target runs its own play: main.yml includes tasks/main.yml.
set -eux
ansible-playbook -i ../../inventory -e "output_dir=${OUTPUT_DIR}" main.yml "$@"
