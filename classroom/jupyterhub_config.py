"""JupyterHub for a workshop on one multi-GPU node: one Unix user per learner, a GPU slice each.

    sudo classroom/hub.sh                      # what an instructor runs (see classroom/README.md)
    jupyterhub -f classroom/jupyterhub_config.py

Everything a class changes is an environment variable (defaults in brackets):

    LABS_HUB_IP [0.0.0.0]  LABS_HUB_PORT [8000]       where learners' browsers connect
    LABS_HUB_API_PORT, LABS_PROXY_API_PORT [8081, 8001] the hub's and the proxy's own, on 127.0.0.1
    LABS_SLICE_SIZE [2]                               GPUs per learner (8 GPUs -> 4 learners of 2)
    LABS_EXCLUDE_GPUS                                 GPUs in no slice, e.g. "5" (a broken one)
    LABUTILS_FAKE_GPUS                                a fake topology ("8") to plan or test without GPUs
    LABS_SPAWNER [systemd]                            systemd | docker | local (no limits: tests only)
    LABS_MEM_LIMIT [node memory / slices]             e.g. "48G"; LABS_CPU_LIMIT [cores / slices]
    LABS_AUTH [pam]                                   pam (Unix passwords) | shared (LABS_SHARED_PASSWORD)
    LABS_USERS, LABS_GROUP [learners], LABS_ADMINS    who may log in (a list, or a Unix group)
    LABS_IDLE_TIMEOUT_S [3600]                        idle servers are stopped (jupyterhub-idle-culler)
    LABS_STATE_DIR [.]                                the hub's database, cookie secret, slices.json
    LABS_DOCKER_IMAGE                                 the learners' image (LABS_SPAWNER=docker)

Each learner's server starts with its slice in ``CUDA_VISIBLE_DEVICES`` (disjoint, best-linked pairs
from NVML: ``labutils.classroom.slices``; who holds which: ``labutils.classroom.book``), and a device cgroup that lets it open only those GPUs
(systemd ``DevicePolicy``/``DeviceAllow``, or Docker's device requests): the variable is what the
learner's code follows, the cgroup is the boundary. On first login ``python -m labutils workspace``
makes ``~/my-labs`` as the learner. ``python -m labutils classroom check --hub-state
STATE_DIR/slices.json`` checks the slices the hub has given.
"""
import asyncio
import os
import pwd
import sys

import psutil

from labutils.classroom import book, slices

c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file

env = os.environ.get
STATE = os.path.abspath(env("LABS_STATE_DIR", "."))
os.makedirs(STATE, mode=0o700, exist_ok=True)
SPAWNER = env("LABS_SPAWNER", "systemd")
BIN = os.path.dirname(sys.executable)  # the course's environment: hub, servers and kernels share it

# --- where it listens: learners on LABS_HUB_IP, the hub's and the proxy's APIs on loopback only
c.JupyterHub.bind_url = f"http://{env('LABS_HUB_IP', '0.0.0.0')}:{env('LABS_HUB_PORT', '8000')}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{env('LABS_HUB_API_PORT', '8081')}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env('LABS_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.pid_file = os.path.join(STATE, "jupyterhub-proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{os.path.join(STATE, 'jupyterhub.sqlite')}"
c.JupyterHub.cookie_secret_file = os.path.join(STATE, "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = os.path.join(STATE, "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every learner's server

# --- who may log in
if env("LABS_AUTH", "pam") == "shared":
    c.JupyterHub.authenticator_class = "shared-password"
    c.SharedPasswordAuthenticator.user_password = env("LABS_SHARED_PASSWORD", "")
else:
    c.JupyterHub.authenticator_class = "pam"
if env("LABS_USERS"):
    c.Authenticator.allowed_users = set(env("LABS_USERS").split(","))
elif c.JupyterHub.authenticator_class == "pam":
    c.LocalAuthenticator.allowed_groups = {env("LABS_GROUP", "learners")}
if env("LABS_ADMINS"):
    c.Authenticator.admin_users = set(env("LABS_ADMINS").split(","))

# --- the slices: planned once from the node's topology, held by learner in STATE/slices.json
TOPOLOGY = slices.read_topology()
EXCLUDE = [int(g) for g in env("LABS_EXCLUDE_GPUS", "").split(",") if g.strip()]  # broken GPUs
PLAN = slices.plan_slices(TOPOLOGY, int(env("LABS_SLICE_SIZE", "2")), exclude=EXCLUDE) if TOPOLOGY.count else []
BOOK = book.SliceBook(PLAN, os.path.join(STATE, "slices.json"))
n_seats = max(len(PLAN), 1)
c.Spawner.mem_limit = env("LABS_MEM_LIMIT", f"{int(psutil.virtual_memory().total / n_seats / 2**30)}G")
c.Spawner.cpu_limit = float(env("LABS_CPU_LIMIT", str(max(1, (os.cpu_count() or 1) // n_seats))))
c.JupyterHub.concurrent_spawn_limit = n_seats
if PLAN:
    c.JupyterHub.active_server_limit = len(PLAN)  # one running server per slice
c.Spawner.default_url = "/lab/tree/my-labs"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 90

if SPAWNER == "systemd":
    c.JupyterHub.spawner_class = "systemdspawner.SystemdSpawner"
    c.SystemdSpawner.unit_name_template = "jupyter-{USERNAME}-singleuser"  # systemctl status <this>
    c.SystemdSpawner.isolate_tmp = True          # a private /tmp per learner
    c.SystemdSpawner.disable_user_sudo = True
    c.SystemdSpawner.cmd = [os.path.join(BIN, "jupyterhub-singleuser")]
    c.SystemdSpawner.extra_paths = [BIN]         # a terminal's `python` is the course's
elif SPAWNER == "docker":
    c.JupyterHub.spawner_class = "dockerspawner.DockerSpawner"
    c.DockerSpawner.image = env("LABS_DOCKER_IMAGE", "gpucomm-labs:latest")
    c.DockerSpawner.remove = True
    c.JupyterHub.hub_connect_ip = env("LABS_HUB_CONNECT_IP", "172.17.0.1")
    c.JupyterHub.hub_bind_url = f"http://0.0.0.0:{env('LABS_HUB_API_PORT', '8081')}"
elif SPAWNER == "local":  # no memory, CPU or device limits: for the tests, never a class
    c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
    c.Spawner.cmd = [os.path.join(BIN, "jupyterhub-singleuser")]
    c.Spawner.env_keep = ["PATH", "PYTHONPATH", "LANG", "LC_ALL", slices.FAKE_ENV]
else:
    raise ValueError(f"LABS_SPAWNER={SPAWNER!r}: use systemd, docker or local (tests only).")


async def prepare_workspace(user: pwd.struct_passwd) -> None:
    """``~/my-labs`` made (or updated) by the learner's own user; the home kept private (0700)."""
    os.chmod(user.pw_dir, 0o700)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labutils", "workspace", "--update", os.path.join(user.pw_dir, "my-labs"),
        user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd=user.pw_dir,
        env={"HOME": user.pw_dir, "USER": user.pw_name, "PATH": os.environ.get("PATH", ""),
             **({"PYTHONPATH": env("PYTHONPATH")} if env("PYTHONPATH") else {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"preparing {user.pw_name}'s workspace failed: {out.decode()[-500:]}")


async def pre_spawn_hook(spawner):
    name = spawner.user.name
    gpus = BOOK.acquire(name) if PLAN else ()
    # a new dict: the configured one may be shared by every learner's spawner
    spawner.environment = {**spawner.environment, **slices.slice_env(gpus),
                           "LABUTILS_SLICE": ",".join(map(str, gpus))}
    if SPAWNER == "systemd":  # the boundary: the unit may open only its own /dev/nvidiaN
        spawner.unit_extra_properties = {"DevicePolicy": "closed",
                                         "DeviceAllow": slices.device_allow(TOPOLOGY, gpus) if gpus else []}
    elif SPAWNER == "docker":
        import docker
        spawner.extra_host_config = {"device_requests": [docker.types.DeviceRequest(
            device_ids=[str(g) for g in gpus], capabilities=[["gpu"]])]} if gpus else {}
        spawner.environment["CUDA_VISIBLE_DEVICES"] = ",".join(str(k) for k in range(len(gpus)))
    if SPAWNER != "docker":  # in a container, the image's start-up makes the workspace
        await prepare_workspace(pwd.getpwnam(name))
    spawner.log.info("%s gets GPUs %s", name, spawner.environment["CUDA_VISIBLE_DEVICES"] or "none")


def post_stop_hook(spawner):
    BOOK.release(spawner.user.name)


c.Spawner.pre_spawn_hook = pre_spawn_hook
c.Spawner.post_stop_hook = post_stop_hook

# --- idle servers are stopped, which gives their slice back
c.JupyterHub.services = [{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={env('LABS_IDLE_TIMEOUT_S', '3600')}"],
}]
c.JupyterHub.load_roles = [{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}]
