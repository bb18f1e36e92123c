"""`fathom serve` for the data tests: started on a free port, its URL read from the line it prints."""
import os
import re
import subprocess
import threading


def start_server(binary, model_dir, *extra):
    """Returns (process, base URL); the caller kills the process."""
    p = subprocess.Popen([binary, "serve", "--model", model_dir, "--port", "0", "--kv-cache-gb", "0.0625",
                          "--max-context", "4096", *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, env=dict(os.environ, FATHOM_THREADS="2"))
    found = {}

    def read():
        for line in p.stdout:
            m = re.search(r"listening on (http://\S+)", line)
            if m and "url" not in found:
                found["url"] = m.group(1)
    t = threading.Thread(target=read, daemon=True)
    t.start()
    for _ in range(1200):
        if "url" in found or p.poll() is not None:
            break
        t.join(0.1)
    if "url" not in found:
        p.kill()
        raise SystemExit("server did not start")
    return p, found["url"]
