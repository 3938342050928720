#!/usr/bin/python3
"""End-to-end test of scripts/slurm/train.sbatch on a real one-node SLURM.

    test_slurm_requeue.py DTRAIN SBATCH_SCRIPT

1. Brings up slurmctld + slurmd from Debian's packages (auth/none, no munge),
   everything - slurm.conf, state, spool, logs, pid files - under a fresh
   temporary directory, on free localhost ports, daemons in the foreground as
   children of this script.
2. Trains a tiny job uninterrupted outside SLURM (`dtrain train --nproc 2`): the
   reference.
3. Submits the sbatch script with 2 tasks on the same job, waits until it has
   logged some steps, and preempts it with `scancel --signal=USR1 JOBID` - that
   signals the job's steps (the srun tasks), as `#SBATCH --signal=USR1@N` does
   near the time limit, but now rather than up to a minute early.
4. Checks: dtrain stopped with exit 4 after a checkpoint, the script requeued the
   job (Restarts=1), the requeued run resumed from that checkpoint (the requeue
   delay is skipped with `scontrol update StartTime=now`) and completed.
5. Compares the final checkpoint with the reference's bit for bit (header meta
   except config_hash, which hashes the resolved job and so its output_dir, and the
   resolved job itself (job_yaml) but for that directory; the tensor table; every
   blob's bytes), and the per-step training losses.
6. Submits the job again and cancels it with a plain `scancel JOBID` (SIGTERM):
   it must end CANCELLED without a requeue, with the checkpoint dtrain saved and
   the script's lines saying so in the job's log.

Teardown (always, also on failure, SIGTERM or the internal deadline): cancel the
jobs, stop the daemons, kill every process left that carries this run's marker
in its environment (slurmstepd, srun, dtrain ranks), remove the directory
(kept when DTRAIN_KEEP_TEST_DIRS is set).  Every wait is bounded.
"""

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

STEPS = 300          # long enough (~5-10 s on 2 cores) to be preempted mid-run
CKPT_EVERY = 20
PREEMPT_AFTER = 25   # logged steps before the USR1
DEADLINE_S = 240     # the whole test; ctest's TIMEOUT is larger so teardown always runs

T0 = time.monotonic()
MARK_VAR = "DTRAIN_SLURM_TEST_DIR"


class Fail(Exception):
    pass


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def remaining():
    return DEADLINE_S - (time.monotonic() - T0)


def run(cmd, env, timeout=30, check=True):
    """Runs a client command (bounded); returns its stdout."""
    timeout = max(1, min(timeout, remaining()))
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Fail(f"{' '.join(cmd)}: no answer within {timeout:.0f} s")
    if check and p.returncode != 0:
        raise Fail(f"{' '.join(cmd)} exited {p.returncode}: {p.stdout}{p.stderr}")
    return p.stdout


def wait_for(what, pred, timeout, interval=0.2):
    """Polls pred() until it returns a truthy value; fails after timeout s."""
    end = time.monotonic() + min(timeout, remaining())
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise Fail(f"timed out waiting for {what}")
        time.sleep(interval)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def marked_pids(tmp):
    """This run's processes (not this script): those whose environment carries the
    marker (srun, dtrain ranks, the daemons) and those with a file open under tmp
    (slurmstepd clears its environment but keeps slurmd.log and the job log open)."""
    needle = f"{MARK_VAR}={tmp}".encode() + b"\0"
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                mine = needle in f.read()
            if not mine:
                for fd in os.listdir(f"/proc/{d}/fd"):
                    if os.readlink(f"/proc/{d}/fd/{fd}").startswith(tmp + "/"):
                        mine = True
                        break
        except OSError:
            continue
        if mine:
            pids.append(int(d))
    return pids


# ---------------------------------------------------------------- checkpoints

def read_checkpoint(path):
    """(meta, tensors) of a .dtckpt: "DTRAINCK", u32 version, header bytes,
    header CRC, 0; the JSON header {"meta", "tensors": [{name, dtype, shape,
    offset, bytes, crc32c}]}; the blobs; a 16-byte end marker."""
    with open(path, "rb") as f:
        b = f.read()
    if b[:8] != b"DTRAINCK" or not b.endswith(b"DTRAINEND" + b"\0" * 7):
        raise Fail(f"{path}: not a complete dtrain checkpoint")
    _version, hlen, _crc, _zero = struct.unpack_from("<4I", b, 8)
    header = json.loads(b[24:24 + hlen])
    tensors = []
    for t in header["tensors"]:
        blob = b[t["offset"]:t["offset"] + t["bytes"]]
        tensors.append((t["name"], t["dtype"], tuple(t["shape"]), t["crc32c"], blob))
    return header["meta"], tensors


def compare_checkpoints(a, b, a_dir, b_dir):
    """'' when a and b hold the same training state bit for bit. a_dir, b_dir: the two
    runs' output directories, which their resolved jobs (meta job_yaml) name."""
    ma, ta = read_checkpoint(a)
    mb, tb = read_checkpoint(b)
    for key in sorted(set(ma) | set(mb)):
        if key == "config_hash":  # FNV-1a of the resolved job, which names output_dir
            continue
        if key == "job_yaml":  # the resolved job itself: the same but for output_dir
            if (ma.get(key) or "").replace(a_dir, b_dir) != mb.get(key):
                return f"meta.job_yaml: {ma.get(key)!r} vs {mb.get(key)!r}"
            continue
        if ma.get(key) != mb.get(key):
            return f"meta.{key}: {ma.get(key)!r} vs {mb.get(key)!r}"
    if [t[:4] for t in ta] != [t[:4] for t in tb]:
        return f"tensor tables differ: {[t[:4] for t in ta]} vs {[t[:4] for t in tb]}"
    for x, y in zip(ta, tb):
        if x[4] != y[4]:
            return f"tensor {x[0]} differs"
    return ""


def losses(metrics):
    """step -> loss of the train lines (the last line for a step wins)."""
    out = {}
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j and "step" in j:
                out[j["step"]] = j["loss"]
    return out


def write_job(path, out_dir):
    with open(path, "w") as f:
        f.write(f"run: {{output_dir: {out_dir}, seed: 1}}\n"
                "model: {arch: resnet18, stem: small, width: 0.125}\n"
                "data: {dataset: fashion-mnist, global_batch: 32, workers: 1,\n"
                "       limit: {train: 200, test: 64}}\n"
                "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                f"train: {{steps: {STEPS}, log_every: 1, checkpoint: {{every: {CKPT_EVERY}}}}}\n"
                # a fixed algorithm: `auto` picks by timing (2 ranks give the same
                # bits with any, but the test should not depend on that)
                "comm: {allreduce: ring}\n"
                "logging: {console: false}\n")


# ---------------------------------------------------------------- SLURM

def write_slurm_conf(tmp, env):
    node = run(["slurmd", "-C"], env).splitlines()[0]  # NodeName=h CPUs=.. RealMemory=..
    m = re.match(r"NodeName=(\S+)", node)
    if not m:
        raise Fail(f"slurmd -C printed {node!r}")
    host = m.group(1)
    node = re.sub(r"\s*UpTime=\S+", "", node)
    conf = os.path.join(tmp, "slurm.conf")
    with open(conf, "w") as f:
        f.write(f"""ClusterName=dtraintest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/log/slurmctld.log
SlurmdLogFile={tmp}/log/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MinJobAge=600
# trust the node line below even where the hardware differs a little
SlurmdParameters=config_overrides
{node} NodeAddr=127.0.0.1
PartitionName=debug Nodes={host} Default=YES State=UP MaxTime=INFINITE
""")
    return conf


def job_info(jobid, env):
    """scontrol's fields of the job as a dict ({} when unknown)."""
    out = run(["scontrol", "show", "job", "-o", str(jobid)], env, check=False)
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    dtrain, sbatch_script = (os.path.abspath(a) for a in sys.argv[1:])
    for tool in ("slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo", "srun"):
        if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
            raise Fail(f"{tool} not found: scripts/install-deps.sh installs "
                       "slurmctld, slurmd and slurm-client")

    tmp = tempfile.mkdtemp(prefix="dtrain-slurm-")
    for d in ("state", "spool", "log", "tmp"):
        os.makedirs(os.path.join(tmp, d))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
    env[MARK_VAR] = tmp                 # every process of this run inherits it
    env["TMPDIR"] = os.path.join(tmp, "tmp")  # Open MPI / PMIx session files
    env["OMP_NUM_THREADS"] = "1"        # both runs: the same thread split
    env["OMP_WAIT_POLICY"] = "passive"
    daemons = []

    def on_signal(signum, _frame):
        raise Fail(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGALRM, on_signal)  # the internal deadline
    signal.alarm(DEADLINE_S + 5)

    ok = False
    try:
        conf = write_slurm_conf(tmp, env)
        env["SLURM_CONF"] = conf
        log(f"slurm under {tmp}")
        for name, args in (("slurmctld", ["-D", "-i"]), ("slurmd", ["-D"])):
            out = open(os.path.join(tmp, "log", name + ".out"), "w")
            daemons.append(subprocess.Popen([name, "-f", conf] + args, env=env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True))
        wait_for("the node to be idle",
                 lambda: "idle" in run(["sinfo", "-h", "-o", "%T"], env, check=False), 30)
        log("slurmctld and slurmd up, node idle")

        # The uninterrupted reference, outside SLURM (mpirun through --nproc).
        ref_job = os.path.join(tmp, "ref.yaml")
        write_job(ref_job, os.path.join(tmp, "ref"))
        t = time.monotonic()
        p = subprocess.run([dtrain, "train", ref_job, "--nproc", "2"], env=env,
                           capture_output=True, text=True, timeout=max(1, min(120, remaining())))
        if p.returncode != 0:
            raise Fail(f"reference run exited {p.returncode}:\n{p.stdout}{p.stderr}")
        log(f"reference: {STEPS} steps in {time.monotonic() - t:.1f} s")

        # The preempted run under SLURM.
        job = os.path.join(tmp, "job.yaml")
        run_dir = os.path.join(tmp, "run")
        write_job(job, run_dir)
        out_log = os.path.join(tmp, "job.out")
        senv = dict(env, DTRAIN=dtrain)
        jobid = run(["sbatch", "--parsable", "--ntasks=2", "--cpus-per-task=1",
                     f"--output={out_log}", f"--chdir={tmp}", sbatch_script, job],
                    senv).strip().split(";")[0]
        log(f"submitted job {jobid}")
        metrics = os.path.join(run_dir, "metrics.jsonl")

        def steps_logged():
            try:
                with open(metrics) as f:
                    return sum(1 for line in f if '"loss"' in line)
            except OSError:
                return 0

        def ready_to_preempt():
            if steps_logged() >= PREEMPT_AFTER:
                return True
            st = job_info(jobid, env).get("JobState")
            if st not in ("PENDING", "CONFIGURING", "RUNNING"):
                raise Fail(f"job {st} before {PREEMPT_AFTER} steps were logged")
            return False
        wait_for(f"{PREEMPT_AFTER} logged steps", ready_to_preempt, 60, 0.1)
        run(["scancel", "--signal=USR1", jobid], env)
        log(f"USR1 sent after {steps_logged()} logged steps")

        # The script sees exit 4 and requeues; SLURM holds a requeued job ~2 min
        # (Reason=BeginTime): release it at once.
        def requeued():
            info = job_info(jobid, env)
            st = info.get("JobState")
            if st in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
                raise Fail(f"job ended instead of being requeued: {st}"
                           f" ExitCode={info.get('ExitCode')}")
            return st if info.get("Restarts") == "1" and st != "COMPLETING" else None
        if wait_for("the job to be requeued (Restarts=1)", requeued, 60) == "PENDING":
            # (check=False: the job may have started on its own in the meantime)
            run(["scontrol", "update", f"jobid={jobid}", "StartTime=now"], env, check=False)
            log("requeued, pending; scontrol update StartTime=now")
        else:
            log("requeued")

        def finished():
            info = job_info(jobid, env)
            st = info.get("JobState")
            return info if st in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") else None
        info = wait_for("the requeued job to finish", finished, 120, 0.5)
        text = open(out_log).read()
        print("---- job output (both runs, --open-mode=append) ----\n" + text +
              "----------------------------------------------------", flush=True)
        if info["JobState"] != "COMPLETED" or info.get("ExitCode") != "0:0":
            raise Fail(f"job ended {info['JobState']} ExitCode={info.get('ExitCode')}")
        if info.get("Restarts") != "1":
            raise Fail(f"Restarts={info.get('Restarts')}, expected 1")
        log("job completed after one requeue")

        # What the log must show, in order.
        m = re.search(r"signal 10 \(SIGUSR1[^)]*\) received: checkpoint saved at step (\d+)", text)
        if not m:
            raise Fail("no 'signal 10 (SIGUSR1...) received: checkpoint saved' in the job output")
        stop = int(m.group(1))
        if not 0 < stop < STEPS:
            raise Fail(f"stopped at step {stop}, not mid-run")
        expected = [
            "train.sbatch: job {} restart 0".format(jobid),
            "no checkpoint yet; starting from step 0",
            m.group(0),
            "train.sbatch: dtrain exited 4",
            "train.sbatch: checkpoint saved; requeueing job {}".format(jobid),
            "train.sbatch: job {} restart 1".format(jobid),
            "resumed from {}/checkpoints/step-{:08d}.dtckpt at step {}".format(run_dir, stop, stop),
            f"done: {STEPS} steps",
            "train.sbatch: dtrain exited 0",
        ]
        at = 0
        for line in expected:
            i = text.find(line, at)
            if i < 0:
                raise Fail(f"job output lacks (after offset {at}): {line!r}")
            at = i + len(line)
        log(f"stopped at step {stop}, resumed from step-{stop:08d}.dtckpt")

        # Bit for bit against the reference.
        name = f"step-{STEPS:08d}.dtckpt"
        diff = compare_checkpoints(os.path.join(tmp, "ref", "checkpoints", name),
                                   os.path.join(run_dir, "checkpoints", name),
                                   os.path.join(tmp, "ref"), run_dir)
        if diff:
            raise Fail(f"final checkpoints differ: {diff}")
        la, lb = losses(os.path.join(tmp, "ref", "metrics.jsonl")), losses(metrics)
        if sorted(lb) != list(range(1, STEPS + 1)):
            raise Fail(f"the preempted run logged steps {sorted(lb)[:5]}...{sorted(lb)[-5:]}")
        bad = [s for s in la if la[s] != lb.get(s)]
        if bad:
            raise Fail(f"losses differ from step {bad[0]}: {la[bad[0]]!r} vs {lb.get(bad[0])!r}")
        log(f"final checkpoint and {STEPS} losses identical to the uninterrupted run")

        # A plain `scancel` (SIGTERM to the shell, srun and the tasks): the job ends
        # CANCELLED, not requeued, and its log still says what happened: the
        # checkpoint dtrain saved and how to continue from it.
        run_dir2 = os.path.join(tmp, "run2")
        job2 = os.path.join(tmp, "job2.yaml")
        write_job(job2, run_dir2)
        out_log2 = os.path.join(tmp, "job2.out")
        jobid2 = run(["sbatch", "--parsable", "--ntasks=2", "--cpus-per-task=1",
                      f"--output={out_log2}", f"--chdir={tmp}", sbatch_script, job2],
                     senv).strip().split(";")[0]
        metrics2 = os.path.join(run_dir2, "metrics.jsonl")

        def logged2():
            try:
                with open(metrics2) as f:
                    return sum(1 for line in f if '"loss"' in line) >= PREEMPT_AFTER
            except OSError:
                return False
        wait_for(f"{PREEMPT_AFTER} logged steps of job {jobid2}", logged2, 60, 0.1)
        run(["scancel", jobid2], env)
        log(f"scancel {jobid2}")

        def ended2():
            info = job_info(jobid2, env)
            st = info.get("JobState")
            return info if st in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") else None
        info2 = wait_for("the cancelled job to end", ended2, 60, 0.5)
        # the batch shell's last lines come after the state change: give it a moment
        wait_for("the job log's last line", lambda: "train.sbatch: dtrain exited" in
                 open(out_log2).read(), 20, 0.2)
        text2 = open(out_log2).read()
        print("---- cancelled job output ----\n" + text2 + "------------------------------",
              flush=True)
        if info2["JobState"] != "CANCELLED" or info2.get("Restarts") != "0":
            raise Fail(f"cancelled job ended {info2['JobState']} Restarts={info2.get('Restarts')}")
        m2 = re.search(r"signal 15 \(SIGTERM\) received: checkpoint saved at step (\d+)", text2)
        if not m2:
            raise Fail("no 'signal 15 (SIGTERM) received: checkpoint saved' in the cancelled job's output")
        expected2 = [
            "train.sbatch: SIGTERM reached the batch shell",
            "train.sbatch: dtrain exited 4",
            "train.sbatch: cancelled after a checkpoint; not requeued",
        ]
        for line in expected2:
            if line not in text2:
                raise Fail(f"cancelled job's output lacks: {line!r}")
        ckpt2 = os.path.join(run_dir2, "checkpoints", f"step-{int(m2.group(1)):08d}.dtckpt")
        if not os.path.exists(ckpt2):
            raise Fail(f"{ckpt2} is missing")
        log(f"scancel: checkpoint at step {m2.group(1)} and the log says so")
        ok = True
    except Fail as e:
        print(f"FAIL: {e}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.alarm(0)
        teardown(tmp, env, daemons, failed=not ok)
    return 0 if ok else 1


def teardown(tmp, env, daemons, failed):
    if env.get("SLURM_CONF") and daemons and all(d.poll() is None for d in daemons):
        # Cancel every job and let slurmd see its steps end (bounded), so no
        # slurmstepd is left talking to a stopped slurmd.
        try:
            subprocess.run(["scancel", "--full", "--signal=KILL", "--user=root"], env=env,
                           capture_output=True, timeout=10)
            subprocess.run(["scancel", "--user=root"], env=env, capture_output=True, timeout=10)
            end = time.monotonic() + 20
            while time.monotonic() < end:
                q = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=env, capture_output=True,
                                   text=True, timeout=10)
                if q.returncode == 0 and not q.stdout.strip():
                    break
                time.sleep(0.5)
        except Exception as e:  # the daemons may be the problem; kill below regardless
            print(f"teardown: {e}", flush=True)
    for d in reversed(daemons):
        if d.poll() is None:
            d.terminate()
    for d in reversed(daemons):
        try:
            d.wait(timeout=10)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait(timeout=10)
    for _ in range(20):  # slurmstepd, srun, dtrain ranks: anything of this run still alive
        pids = marked_pids(tmp)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)
    else:
        print(f"WARNING: processes left: {marked_pids(tmp)}", flush=True)
    if failed:  # the job's and the daemons' side of the story
        for name in ("job.out", "log/slurmctld.log", "log/slurmd.log"):
            path = os.path.join(tmp, name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    tail = f.read().splitlines()[-25:]
                print(f"---- tail of {name} ----\n" + "\n".join(tail), flush=True)
    if failed and os.environ.get("DTRAIN_KEEP_TEST_DIRS"):
        print(f"kept {tmp}", flush=True)
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Fail as e:  # before anything was started
        print(f"FAIL: {e}", flush=True)
        sys.exit(1)
