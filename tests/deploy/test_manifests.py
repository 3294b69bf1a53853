#!/usr/bin/env python3
"""The deployment files parse and carry what the library reads (Kubernetes and Docker cannot run
here, so this is what can be checked): the Indexed Job and its headless Service agree (pod index ->
RANK, pod 0's name under the Service -> MASTER_ADDR, the world = completions = parallelism, the
port served and exposed, a memory-backed /dev/shm), compose's ranks are 0..N-1 meeting at rank 0's
service, every variable any of them sets is one the sources read, the batch script is valid bash
with its #SBATCH lines, and the Dockerfile builds with scripts/setup.sh on Debian 12 in two stages.
usage: test_manifests.py REPO_ROOT"""
import os
import re
import subprocess
import sys

try:
    import yaml
except ImportError:
    print("skip: python3-yaml is not installed (apt-get install python3-yaml)")
    sys.exit(77)

root = sys.argv[1] if len(sys.argv) > 1 else "."
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def read(path):
    with open(os.path.join(root, path)) as f:
        return f.read()


# every string literal in the C sources: the names the library and CLI read
sources = ""
for d in ("src", "tools"):
    for dirpath, _, files in os.walk(os.path.join(root, d)):
        for f in files:
            if f.endswith((".c", ".h")):
                with open(os.path.join(dirpath, f)) as fh:
                    sources += fh.read()
read_names = set(re.findall(r'"([A-Z][A-Z0-9_]+)"', sources))


def env_read(names, where):
    unknown = sorted(n for n in names if n not in read_names)
    check(not unknown, f"{where}: every variable set is read by tandem (unknown: {unknown})")


def mem_bytes(q):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", str(q))
    return int(m.group(1)) * {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}[m.group(2)] if m else -1


# ---- Kubernetes ----
docs = []
for f in sorted(os.listdir(os.path.join(root, "deploy/k8s"))):
    if f.endswith((".yaml", ".yml")):
        docs += [d for d in yaml.safe_load_all(read("deploy/k8s/" + f)) if d]
kinds = {d["kind"]: d for d in docs}
check(set(kinds) == {"Job", "Service"}, f"deploy/k8s: one Job and one Service (found {sorted(kinds)})")
job, svc = kinds.get("Job", {}), kinds.get("Service", {})
js, pod = job.get("spec", {}), job.get("spec", {}).get("template", {}).get("spec", {})
labels = job.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
check(job.get("apiVersion") == "batch/v1" and js.get("completionMode") == "Indexed", "k8s: an Indexed batch/v1 Job")
check(svc.get("spec", {}).get("clusterIP") == "None", "k8s: the Service is headless (clusterIP: None)")
sel = svc.get("spec", {}).get("selector", {})
check(sel and all(labels.get(k) == v for k, v in sel.items()), f"k8s: the Service selects the Job's pods ({sel} in {labels})")
check(pod.get("subdomain") == svc.get("metadata", {}).get("name"), "k8s: the pods' subdomain is the Service's name")
ctr = (pod.get("containers") or [{}])[0]
env = {e["name"]: e for e in ctr.get("env", [])}
val = {k: e.get("value") for k, e in env.items()}
world = int(val.get("WORLD_SIZE") or -1)
check(world >= 1 and js.get("completions") == world and js.get("parallelism") == world,
      f"k8s: WORLD_SIZE {world} = completions {js.get('completions')} = parallelism {js.get('parallelism')}")
rank_src = env.get("RANK", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
check(rank_src == "metadata.annotations['batch.kubernetes.io/job-completion-index']", "k8s: RANK is the pod's completion index")
want_master = f"{job.get('metadata', {}).get('name')}-0.{svc.get('metadata', {}).get('name')}"
check(val.get("MASTER_ADDR") == want_master, f"k8s: MASTER_ADDR is pod 0's name {want_master} (got {val.get('MASTER_ADDR')})")
port = int(val.get("MASTER_PORT") or -1)
check(port in [p.get("containerPort") for p in ctr.get("ports", [])] and port in [p.get("port") for p in svc.get("spec", {}).get("ports", [])],
      f"k8s: MASTER_PORT {port} is the container's and the Service's port")
lws = int(val.get("LOCAL_WORLD_SIZE") or -1)
check(1 <= lws <= world and world % lws == 0, f"k8s: LOCAL_WORLD_SIZE {lws} divides the world {world}")
mounts = {m["name"]: m["mountPath"] for m in ctr.get("volumeMounts", [])}
vols = {v["name"]: v for v in pod.get("volumes", [])}
shm = [n for n, p in mounts.items() if p == "/dev/shm"]
ed = vols.get(shm[0], {}).get("emptyDir", {}) if shm else {}
check(bool(shm) and ed.get("medium") == "Memory" and mem_bytes(ed.get("sizeLimit")) >= 256 << 20,
      f"k8s: /dev/shm is a memory-backed emptyDir of at least 256 MiB (got {ed})")
env_read(env, "k8s")

# ---- compose ----
comp = yaml.safe_load(read("deploy/compose.yaml"))
services = comp.get("services", {})
ranks = {name: s.get("environment", {}) for name, s in services.items()}
rvals = sorted(int(e.get("RANK", -1)) for e in ranks.values())
worlds = {int(e.get("WORLD_SIZE", -1)) for e in ranks.values()}
check(len(worlds) == 1 and rvals == list(range(len(ranks))) and worlds == {len(ranks)},
      f"compose: RANKs {rvals} are 0..N-1 and WORLD_SIZE {sorted(worlds)} = {len(ranks)} services")
masters = {e.get("MASTER_ADDR") for e in ranks.values()}
zero = [n for n, e in ranks.items() if int(e.get("RANK", -1)) == 0]
check(len(masters) == 1 and zero and masters == {zero[0]}, f"compose: MASTER_ADDR {sorted(map(str, masters))} is rank 0's service {zero}")
check(all(int(e.get("LOCAL_WORLD_SIZE", 0)) == 1 for e in ranks.values()), "compose: one rank per container")
check(len({s.get("image") for s in services.values()}) == 1, "compose: every rank runs one image")
env_read({k for e in ranks.values() for k in e}, "compose")

# ---- Slurm batch script ----
sb = read("deploy/slurm/train.sbatch")
check(subprocess.run(["bash", "-n", os.path.join(root, "deploy/slurm/train.sbatch")]).returncode == 0, "sbatch: valid bash")
opts = dict(re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", sb, re.M))
check(int(opts.get("nodes", "0")) > 1 and "ntasks-per-node" in opts and "cpus-per-task" in opts,
      f"sbatch: several nodes, tasks per node and cpus per task ({opts})")
check(re.search(r"^srun .*\"\$TANDEM\" train ", sb, re.M) is not None, "sbatch: srun starts tandem train once per task")
check(not re.search(r"^\s*export (RANK|WORLD_SIZE|MASTER_ADDR)=", sb, re.M), "sbatch: sets no rank, world or address by hand")

# ---- Dockerfile ----
df = read("deploy/Dockerfile")
froms = re.findall(r"^FROM (\S+)", df, re.M)
check(len(froms) == 2 and all(f.startswith("debian:12") for f in froms), f"Dockerfile: two Debian 12 stages ({froms})")
check("./scripts/setup.sh" in df and "COPY --from=build" in df, "Dockerfile: builds with scripts/setup.sh, copies only the binary")
check(os.access(os.path.join(root, "scripts/setup.sh"), os.X_OK), "Dockerfile: scripts/setup.sh exists and runs")
# an image runs on other machines than the one that built it: no -march=native unless asked for
check(re.search(r"^ARG TANDEM_NATIVE=OFF$", df, re.M) is not None and '-DTANDEM_NATIVE="$TANDEM_NATIVE"' in df,
      "Dockerfile: a portable build by default (TANDEM_NATIVE=OFF, a build argument)")

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
