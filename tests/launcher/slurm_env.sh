#!/usr/bin/env bash
# srun without hand-set addresses: two ranks of allreduce_bench started with the
# variables a real `srun -n 2` sets (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
# SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_JOB_ID, ...) and no BRAID_*/MASTER_*
# address: the store must be found at the step's first node and the port derived from
# the job id, and the checked all-reduces must pass. The node list is localhost, so
# rank 0's store listens on loopback; a real srun across nodes (where it does not) is
# ctest cluster_slurm (tests/cluster/slurm_test.sh, scripts/slurm.sh).
set -u
bench=$1
for v in $(env | sed -n 's/^\(BRAID_[A-Z_]*\|MASTER_[A-Z]*\|RANK\|WORLD_SIZE\|LOCAL_RANK\|OMPI_[A-Z_]*\|PMIX_[A-Z_]*\)=.*/\1/p'); do
  unset "$v"
done
# A job id whose derived port (15000 + id mod 10000) is free here.
for _ in $(seq 1 50); do
  job=$((RANDOM % 10000 + 500000))
  port=$((15000 + job % 10000))
  ss -ltn 2>/dev/null | grep -q ":$port " || break
done
pids=()
for r in 0 1; do
  SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_NPROCS=2 SLURM_LOCALID=$r SLURM_NODEID=0 SLURM_NNODES=1 \
  SLURM_JOB_ID=$job SLURM_JOBID=$job SLURM_STEP_ID=0 SLURM_STEP_NODELIST=localhost SLURM_JOB_NODELIST=localhost \
  SLURM_NODELIST=localhost SLURM_TASKS_PER_NODE=2 SLURM_LAUNCH_NODE_IPADDR=127.0.0.1 SLURMD_NODENAME=localhost \
  BRAID_TIMEOUT=60s timeout -k 5 100 "$bench" -b 1K -e 256K -f 16 -n 2 -w 1 -c 1 --quiet >"/tmp/slurm_env.$$.$r" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "/tmp/slurm_env.$$.0" "/tmp/slurm_env.$$.1"
wrong=$(awk '!/^#/ && NF >= 12 {s += $8 + $12} END {print s + 0}' "/tmp/slurm_env.$$.0")
ok=$(grep -c "Out of bounds values : 0 OK" "/tmp/slurm_env.$$.0")
rows=$(grep -cE '^ +[0-9]+ ' "/tmp/slurm_env.$$.0")
rm -f "/tmp/slurm_env.$$.0" "/tmp/slurm_env.$$.1"
[ $rc -eq 0 ] || { echo "FAIL: a rank exited non-zero (job $job, port $port)"; exit 1; }
[ "$rows" -ge 3 ] || { echo "FAIL: rank 0 printed $rows result rows"; exit 1; }
[ "$wrong" = 0 ] && [ "$ok" = 1 ] || { echo "FAIL: $wrong wrong values"; exit 1; }
echo "PASS: 2 ranks under a srun environment (job $job) found the store at localhost:$port"
