"""A JupyterLab server and notebooks in Chromium, driven as a student would (test_browser.py).

The server runs on 127.0.0.1 with a random token in a folder of copies (JupyterLab autosaves),
with `expose_app_in_browser` so a test can read a notebook's model: which cells ran, what they
output, whether the kernel is busy.
"""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

CHROMIUM = "/usr/bin/chromium"  # Debian's: Playwright's own download is not reachable here
START_S = 60  # JupyterLab's first start builds nothing, but a loaded 2-core machine is slow


def missing():
    """Why a browser test cannot run here ('' when it can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no browser at {CHROMIUM} (apt-get install chromium)"
    return ""


class Server:
    """`jupyter lab` serving `root`; `url(path)` opens a notebook; `stop()` ends it, kernels too."""

    def __init__(self, root):
        self.root, self.token = root, secrets.token_hex(16)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = os.path.join(root, ".jupyter")  # no settings of this machine's user
        env = {**os.environ, "OMP_NUM_THREADS": "1", "JUPYTER_CONFIG_DIR": config,
               "JUPYTER_RUNTIME_DIR": os.path.join(config, "runtime")}
        as_root = ["--allow-root"] if os.geteuid() == 0 else []  # CI's container runs as root
        self.log = open(os.path.join(root, ".server.log"), "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--port={self.port}", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
             f"--LabApp.workspaces_dir={config}/workspaces",
             f"--LabApp.user_settings_dir={config}/settings", *as_root],
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()

    def _wait_ready(self):
        end = time.monotonic() + START_S
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: {open(self.log.name).read()[-2000:]}")
            try:
                self.api("GET", "status")
                return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"jupyter lab did not answer in {START_S} s")

    def url(self, path):
        return f"http://127.0.0.1:{self.port}/lab/tree/{path}?reset&token={self.token}"

    def api(self, method, path):
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            body = reply.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self):
        """Shut down every kernel (a kernel's ranks and forkserver end with it)."""
        for kernel in self.api("GET", "kernels"):
            self.api("DELETE", f"kernels/{kernel['id']}")

    def stop(self):
        try:
            self.shutdown_kernels()
        except OSError:
            pass
        self.process.send_signal(signal.SIGTERM)  # the server shuts down what is left
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)
        self.log.close()


def copy_course(root, course):
    """Copies of lessons/ and exercises/ under `root`: what the browser may autosave over."""
    for folder in ("lessons", "exercises"):
        shutil.copytree(os.path.join(course, folder), os.path.join(root, folder))


# The open notebook as data: per code cell its execution count, whether it is running, and its
# outputs (type, error name, text); and the kernel's status.
NOTEBOOK_STATE = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  if (!panel || !panel.content || !panel.content.model || !panel.sessionContext) return null;
  const cells = panel.content.widgets.filter(c => c.model.type === 'code').map(c => {
    const outputs = [];
    for (let i = 0; i < c.model.outputs.length; i++) {
      const o = c.model.outputs.get(i).toJSON();
      const text = o.text || (o.data && o.data['text/plain']) || (o.traceback || []).join('\\n');
      outputs.push({type: o.output_type, ename: o.ename || '',
                    text: (Array.isArray(text) ? text.join('') : String(text || '')).slice(-4000)});
    }
    return {count: c.model.executionCount, running: c.promptNode.textContent.includes('*'),
            outputs};
  });
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  return {kernel: kernel ? kernel.status : 'none', cells};
}"""


# The same, cheaply, for polling while cells run: counts, running marks, whether a cell shows an
# error, and the kernel's status; no output is serialised (a lesson's figures are large, and
# serialising them ten times a second took the CPU the kernel and its ranks needed).
NOTEBOOK_PROGRESS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  if (!panel || !panel.content || !panel.content.model || !panel.sessionContext) return null;
  const cells = panel.content.widgets.filter(c => c.model.type === 'code').map(c => {
    let error = false;
    for (let i = 0; i < c.model.outputs.length; i++) {
      error = error || c.model.outputs.get(i).type === 'error';
    }
    return {count: c.model.executionCount, running: c.promptNode.textContent.includes('*'),
            error};
  });
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  return {kernel: kernel ? kernel.status : 'none', cells};
}"""


class Notebook:
    """One notebook open in its own browser page."""

    def __init__(self, context, server, path):
        self.page = context.new_page()
        self.page.set_default_timeout(30_000)
        self.page.goto(server.url(path), timeout=60_000)
        self.page.wait_for_function(
            "() => { try { const s = (" + NOTEBOOK_STATE + ")(); return s && s.kernel === 'idle'; }"
            " catch (e) { return false; } }",
            timeout=90_000)

    def state(self):
        return self.page.evaluate(NOTEBOOK_STATE)

    def command(self, name, args=None):
        """Start JupyterLab's command `name`, not waiting for it (Run All ends with the cells)."""
        self.page.evaluate("([name, args]) => { window.jupyterapp.commands.execute(name, args); }",
                           [name, args or {}])

    def run_all(self, timeout):
        """Run All; wait until the last code cell ran or a cell failed."""
        self.clear()
        self.command("notebook:run-all-cells")
        self.wait(lambda s: s["cells"][-1]["count"] is not None or any(c["error"] for c in
                                                                         s["cells"]),
                  timeout, query=NOTEBOOK_PROGRESS, every=0.25)
        return self.state()

    def clear(self):
        """A committed notebook has its saved counts: cleared, a count proves a cell ran now."""
        self.command("notebook:clear-all-cell-outputs")
        self.page.wait_for_function("() => (" + NOTEBOOK_STATE + ")().cells.every("
                                    "c => c.count === null)")

    def run_cell(self, index, timeout):
        """Run code cell `index` (0-based among code cells) as Shift+Enter would."""
        self.page.evaluate("""(index) => {
          const nb = window.jupyterapp.shell.currentWidget.content;
          const code = nb.widgets.map((c, i) => [c, i]).filter(([c]) => c.model.type === 'code');
          nb.activeCellIndex = code[index][1];
        }""", index)
        before = self.state()["cells"][index]["count"]
        self.command("notebook:run-cell")
        return self.wait(lambda s: s["cells"][index]["count"] not in (None, before), timeout)

    def wait(self, done, timeout, query=NOTEBOOK_STATE, every=0.1):
        """The notebook's state (`query`'s answer) once `done(state)`, the kernel is idle and
        no cell is queued; asked `every` seconds."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            state = self.page.evaluate(query)
            if done(state) and state["kernel"] == "idle" and not any(c["running"] for c in
                                                                      state["cells"]):
                return state
            time.sleep(every)
        raise TimeoutError(f"the notebook was still running after {timeout} s")

    def close(self):
        self.page.close()


def errors(state):
    """Every error output of the notebook, as (code cell index, its text)."""
    return [(i, o["text"]) for i, cell in enumerate(state["cells"]) for o in cell["outputs"]
            if o["type"] == "error"]


def outputs_text(cell):
    return "".join(o["text"] for o in cell["outputs"])
