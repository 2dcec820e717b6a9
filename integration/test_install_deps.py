"""scripts/install-deps.sh installs every external program the test command runs.

scripts/test-programs.txt lists the external programs that scripts/test.sh,
the scripts and tests it runs, and the programs those start (netavark runs
iptables, podman runs runc) need, each with its Debian package. Checked here,
offline, in about a second:

- every listed package comes with `scripts/install-deps.sh --test` on a fresh
  machine: it is in that list (`--print-packages`), or in the Depends and
  Pre-Depends of those, recursively, or in every Debian system (Essential,
  Priority required, and theirs). The dependencies are dpkg's, of the
  packages installed here, resolved as apt would on a fresh machine: of
  `crun | runc` the first, unless runc is listed; a virtual package only
  through a provider that is there anyway (Dpkg.closure). What
  scripts/run.sh and scripts/build.sh run comes with the list without --test;
- every listed program is there after the install, shipped by that package;
- the sources run no program the list lacks: scripts/*.sh and .ci/run (the
  first word of each command; `command -v X`; what timeout, taskset & co.
  run) and the Python of integration/ and scripts/ (the first string of a
  command list given to subprocess or of an argv-shaped list, shutil.which(),
  the `for tool in (...)` loops that check with which()). A program of an
  Essential or required package, a shell builtin or this project's own
  binary needs no line. The scan is static and conservative: a command built
  from variables is not seen, a name it cannot place fails with file:line.

Run: cd integration && python3 -m unittest -v test_install_deps
"""
from __future__ import annotations

import ast
import functools
import glob
import os
import re
import shutil
import subprocess
import tempfile
import unittest
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(ROOT, "scripts", "test-programs.txt")
DPKG_INFO = "/var/lib/dpkg/info"

#: Scanned sources. The Dockerfile and integration/images/ are not: their RUN
#: lines run inside the image, which installs its own packages.
SHELL_SOURCES = ("scripts/*.sh", ".ci/run")
PYTHON_SOURCES = ("integration/*.py", "integration/**/*.py", "scripts/*.py")
#: What scripts/run.sh runs (it installs without --test): must come with the base list.
BASE_SOURCES = ("scripts/run.sh", "scripts/build.sh", "scripts/demo_backend.py")

#: Programs that need no line in scripts/test-programs.txt, with why.
ALLOWED = {
    # bash builtins and keywords (a command's first word, never a program)
    **dict.fromkeys(
        ". : [ [[ alias bg break builtin caller cd command compgen complete continue declare dirs disown echo "
        "enable eval exec exit export false fc fg getopts hash help history jobs kill let local logout mapfile "
        "popd printf pushd pwd read readarray readonly return set shift shopt source suspend test time times "
        "trap true type typeset ulimit umask unalias unset wait".split(), "a bash builtin"),
    "python3": "runs the tests themselves",
    "python": "runs the tests themselves",
    "smockron-proxy": "this project's", "smockron-master": "this project's", "smockron-query": "this project's",
    "dockerfile-utils": "npm-installed into build/tools/ by scripts/install-deps.sh --test",
}

#: Calls whose first argument is a command: a list (its first string) or a string (its first word).
RUNNERS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput", "system",
           "spawn", "execv", "execvp", "execl", "execlp"}
#: Calls whose string arguments are program names: shutil.which and this tree's helpers around it.
LOOKUPS = {"which", "need", "tool"}
#: Programs that run the command that follows their options (which is scanned too).
WRAPPERS = {"taskset", "unshare", "timeout", "nice", "ionice", "env", "sudo", "stdbuf", "setsid", "chrt",
            "nohup", "xargs", "exec", "command", "time", "type", "hash"}
NAME = re.compile(r"(\[\[?|[A-Za-z0-9_][A-Za-z0-9_.+-]*)$")
ASSIGNMENT = re.compile(r"[A-Za-z_]\w*(\[[^]]*\])?\+?=")
NUMBERISH = re.compile(r"[\d.,:-]+$")


@dataclass
class Entry:
    program: str
    package: str
    optional: bool
    line: int

    @property
    def name(self) -> str:
        return os.path.basename(self.program)


def read_programs() -> list[Entry]:
    entries = []
    with open(PROGRAMS) as f:
        for n, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) not in (2, 3) or (len(words) == 3 and words[2] != "optional"):
                raise AssertionError(f"scripts/test-programs.txt:{n}: want `program package [optional]`: {line!r}")
            entries.append(Entry(words[0], words[1], len(words) == 3, n))
    return entries


def install_deps_packages(*flags: str) -> set[str]:
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "install-deps.sh"), "--print-packages", *flags],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise AssertionError(f"install-deps.sh --print-packages {' '.join(flags)} failed: {r.stderr}")
    packages = set(r.stdout.split())
    if len(packages) < 10:
        raise AssertionError(f"install-deps.sh --print-packages {' '.join(flags)} listed only {packages}")
    return packages


class Dpkg:
    """The installed packages (dpkg's database, no network): their dependencies and files."""

    def __init__(self):
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${db:Status-Abbrev}\t${Essential}\t"
                              "${Priority}\t${Provides}\t${Pre-Depends}, ${Depends}\n"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
        self.depends: dict[str, list[list[str]]] = {}
        self.providers: dict[str, set[str]] = {}
        self.base: set[str] = set()  # Essential or Priority required: on every Debian system
        for line in out.splitlines():
            name, status, essential, priority, provides, depends = line.split("\t")
            if status[1:2] != "i":
                continue
            self.depends[name] = [[self._name(a) for a in group.split("|")]
                                  for group in depends.split(",") if group.strip()]
            for p in provides.split(","):
                if p.strip():
                    self.providers.setdefault(self._name(p), set()).add(name)
            if essential == "yes" or priority == "required":
                self.base.add(name)

    @staticmethod
    def _name(dep: str) -> str:
        """'libc6 (>= 2.34)' -> 'libc6'; 'python3:any' -> 'python3'."""
        return dep.strip().split(" ")[0].split(":")[0]

    def installed(self, package: str) -> bool:
        return package in self.depends

    def closure(self, roots: set[str]) -> set[str]:
        """roots and their Depends and Pre-Depends, recursively, as apt resolves them for a fresh
        machine, erring on the side of too little: of alternatives (a | b), one already chosen,
        else the first that is not a virtual package; a virtual package only as a provider chosen
        for another reason (which provider apt would pick is not known offline). A package not
        installed here is counted, its own dependencies not (they are not known offline)."""
        chosen: set[str] = set()
        todo: list[str] = []
        deferred: list[list[str]] = []

        def virtual(name: str) -> bool:
            return not self.installed(name) and name in self.providers

        def satisfied(alt: str) -> bool:
            return alt in chosen or bool(self.providers.get(alt, set()) & chosen)

        def choose(name: str) -> None:
            if name not in chosen:
                chosen.add(name)
                todo.append(name)

        for root in roots:  # a listed name counts as itself (NodeSource's nodejs provides npm: still npm)
            choose(root)
        while True:
            while todo:  # plain dependencies first: they decide which alternatives are already there
                for group in self.depends.get(todo.pop(), []):
                    if len(group) > 1 or virtual(group[0]):
                        deferred.append(group)
                    elif not satisfied(group[0]):
                        choose(group[0])
            pick = next((real for g in deferred if not any(satisfied(a) for a in g)
                         for real in [next((a for a in g if not virtual(a)), None)] if real), None)
            if pick is None:
                return chosen
            choose(pick)

    def files(self, package: str) -> set[str]:
        """The paths a package ships (usrmerge: /bin/x also as /usr/bin/x)."""
        paths: set[str] = set()
        for lst in glob.glob(os.path.join(DPKG_INFO, f"{package}.list")) + \
                glob.glob(os.path.join(DPKG_INFO, f"{package}:*.list")):
            with open(lst) as f:
                for p in f.read().splitlines():
                    paths.add(p)
                    if p.startswith(("/bin/", "/sbin/", "/lib/")):
                        paths.add("/usr" + p)
        return paths

    def base_programs(self) -> set[str]:
        """The names of the programs Essential and Priority required packages ship."""
        names = set()
        for package in self.base:
            names.update(os.path.basename(p) for p in self.files(package)
                         if re.match(r"(/usr)?/s?bin/[^/]+$", p))
        return names


def locate(program: str) -> list[str]:
    """Where the program is: an absolute path as given; a name on PATH and in the sbin directories."""
    if os.path.isabs(program):
        return [program] if os.access(program, os.X_OK) else []
    found = [shutil.which(program)] + [os.path.join(d, program) for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin")]
    return [p for p in dict.fromkeys(found) if p and os.access(p, os.X_OK)]


def link_chain(path: str) -> list[str]:
    """path and every symlink hop after it (/usr/bin/c++ -> /etc/alternatives/c++ -> /usr/bin/g++ ...)."""
    chain = [path]
    while os.path.islink(chain[-1]) and len(chain) < 10:
        chain.append(os.path.normpath(os.path.join(os.path.dirname(chain[-1]), os.readlink(chain[-1]))))
    return chain


# ---------------------------------------------------------------------------------------- the scan

def shell_blank(line: str) -> str:
    """line with quoted text and expansions reduced to `""` (the command substitutions in them
    kept, as `$(...)`) and the comment dropped, so that only command words are left."""
    out, i, n = [], 0, len(line)
    stack = [["N", 0]]  # N: normal (a command substitution when not the bottom one), D: in "..."

    def skip_balanced(j: int, open_: str, close: str) -> int:
        depth = 0
        while j < n:
            if line[j] == open_:
                depth += 1
            elif line[j] == close:
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return n

    while i < n:
        c, state = line[i], stack[-1]
        if c == "\\":
            i += 2
            continue
        if line.startswith("$((", i):  # arithmetic, never a command
            i = skip_balanced(i + 1, "(", ")")
            out.append('""')
            continue
        if line.startswith("${", i):
            i = skip_balanced(i + 1, "{", "}")
            out.append('""')
            continue
        if line.startswith("$(", i):
            out.append(' $( ' if state[0] == "N" else '" $( ')
            stack.append(["N", 0])
            i += 2
            continue
        if state[0] == "D":
            if c == '"':
                stack.pop()
                out.append('"')
            i += 1
            continue
        # normal
        if c == "'":
            j = line.find("'", i + 1)
            i = n if j < 0 else j + 1
            out.append('""')
            continue
        if c == '"':
            stack.append(["D", 0])
            out.append('"')
        elif c == "#" and (i == 0 or line[i - 1] in " \t;&|("):
            break
        elif c == "(" and i > 0 and line[i - 1] == "=":  # an array's words: arr=(a b), arr+=(c)
            i = skip_balanced(i, "(", ")")
            out.append('""')
            continue
        elif c == "(":
            state[1] += 1
            out.append(" ( ")
        elif c == ")":
            if state[1] == 0 and len(stack) > 1:
                stack.pop()
                out.append(" ) " if stack[-1][0] == "N" else ' ) "')
            else:
                state[1] = max(0, state[1] - 1)
                out.append(" ) ")
        else:
            out.append(c)
        i += 1
    return "".join(out)


SEPARATORS = re.compile(r"&&|\|\||;;|;|\|&|\||(?<![<>&])&(?!>)|\$\(|\(|\)|`|(?<!\S)[{}](?!\S)")
KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "esac", "function", "{", "}"}
HEADERS = {"for", "case", "select"}  # their words are not a command


def command_words(words: list[str]) -> list[tuple[str, str]]:
    """The programs a simple command runs: (name, how) for its command word and, after a wrapper
    (timeout, taskset, command -v ...), for the command it runs."""
    found, i, wrapped = [], 0, None
    while i < len(words):
        w = words[i]
        i += 1
        if w in KEYWORDS and not wrapped:
            continue
        if w in HEADERS and not wrapped:
            break
        if ASSIGNMENT.match(w) or w.startswith(("<", ">")) or re.match(r"\d*[<>]", w):
            continue
        if wrapped and (w.startswith("-") or NUMBERISH.match(w)):
            continue
        if re.fullmatch(r'"+', w):  # an expansion as the command word: "${sudo_cmd[@]}" apt-get ...
            continue
        if w.startswith("/") and '"' not in w and "$" not in w:
            w = os.path.basename(w)
        if not NAME.match(w):
            break
        found.append((w, f"run by `{wrapped}`" if wrapped else "a command"))
        if w not in WRAPPERS:
            break
        wrapped = w
    return found


def scan_shell(path: str) -> list[tuple[int, str, str]]:
    with open(path) as f:
        lines = f.read().split("\n")
    functions = set(re.findall(r"^\s*(?:function\s+)?([\w-]+)\s*\(\)", "\n".join(lines), re.MULTILINE))
    found, heredoc, pending, start, in_array = [], None, "", 0, False
    for n, line in enumerate(lines, 1):
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        m = re.search(r"(?<!<)<<-?\s*(['\"]?)(\w+)\1", line)
        if m:
            heredoc = m.group(2)  # its body (the following lines) is text, not commands
        if not pending:
            start = n
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        # An array assignment over several lines (packages=( ... )): one line, to its `)`.
        in_array = ")" not in line if in_array else bool(re.search(r"\w\+?=\([^)]*$", line))
        if in_array:
            pending += line + " "
            continue
        text, pending = shell_blank(pending + line), ""
        for segment in SEPARATORS.split(text):
            for name, how in command_words(segment.split()):
                if name not in functions:
                    found.append((start, name, how))
    return found


def _str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _func_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _argv_programs(elts: list) -> list[tuple[str, str]]:
    """The programs of a command list: its first string, and what a wrapper in it runs."""
    found, wrapped = [], None
    for e in elts:
        s = _str(e)
        if s is None:
            break
        if wrapped and (s.startswith("-") or NUMBERISH.match(s) or ASSIGNMENT.match(s)):
            continue
        name = os.path.basename(s) if s.startswith("/") else s
        if not NAME.match(name):
            break
        found.append((name, f"run by `{wrapped}`" if wrapped else "a command list"))
        if name not in WRAPPERS:
            break
        wrapped = name
    return found


def _command_wrappers(tree) -> set[str]:
    """The functions of a module that run their *args as the command: def run(*cmd): subprocess.run(cmd)."""
    names = set()
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.args.vararg:
            v = f.args.vararg.arg
            for c in ast.walk(f):
                if not (isinstance(c, ast.Call) and _func_name(c) in RUNNERS and c.args):
                    continue
                cmd = c.args[0]
                if isinstance(cmd, ast.List) and cmd.elts and isinstance(cmd.elts[0], ast.Starred):
                    cmd = cmd.elts[0].value  # subprocess.run([*cmd, ...])
                if isinstance(cmd, ast.Name) and cmd.id == v:
                    names.add(f.name)
    return names


def scan_python(path: str) -> list[tuple[int, str, str]]:
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    wrappers = _command_wrappers(tree)
    # The lists given to a call or assigned to a name: a command list is one of those.
    placed = {id(n.value) for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))}
    placed |= {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) for a in n.args}
    found, done = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _func_name(node)
            first = node.args[0] if node.args else None
            shell_string = isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id in ("subprocess", "os")
            if name in RUNNERS and isinstance(first, ast.List):
                done.add(id(first))
                found += [(node.lineno, p, how) for p, how in _argv_programs(first.elts)]
            elif _str(first) and ((name in RUNNERS and shell_string) or name in wrappers):
                # subprocess.run("cmd args", shell=True), os.system("..."); run("podman", "ps") of a wrapper
                words = _str(first).split() if shell_string else [_str(first)]
                found += [(node.lineno, p, f"{name}()") for p, _ in _argv_programs([ast.Constant(w) for w in words])]
            elif name in LOOKUPS:
                found += [(node.lineno, _str(a), f"{name}()") for a in node.args if _str(a) and NAME.match(_str(a))]
        elif isinstance(node, ast.List) and id(node) in placed and id(node) not in done and len(node.elts) > 1 \
                and _str(node.elts[0]) and any((_str(e) or "").startswith("-") and len(_str(e)) > 1
                                               for e in node.elts[1:]):
            # argv-shaped, wherever it is built: argv = ["curl", "-s", ...]
            done.add(id(node))
            found += [(node.lineno, p, how) for p, how in _argv_programs(node.elts)]
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) \
                and isinstance(node.iter, (ast.List, ast.Tuple)) and all(_str(e) for e in node.iter.elts):
            # for tool in ("nginx", "wrk"): if not shutil.which(tool) ...
            checks = any(isinstance(c, ast.Call) and _func_name(c) in LOOKUPS and c.args
                         and isinstance(c.args[0], ast.Name) and c.args[0].id == node.target.id
                         for stmt in node.body for c in ast.walk(stmt))
            if checks:
                found += [(node.lineno, _str(e), "checked with which()") for e in node.iter.elts]
    return found


def sources(patterns) -> list[str]:
    paths = set()
    for p in patterns:
        paths.update(glob.glob(os.path.join(ROOT, p), recursive=True))
    return sorted(p for p in paths if os.path.isfile(p))


@functools.cache
def scan() -> list[tuple[str, int, str, str]]:
    """(file, line, program, how) for every program invocation the sources show."""
    out = []
    for path in sources(SHELL_SOURCES):
        out += [(os.path.relpath(path, ROOT), *hit) for hit in scan_shell(path)]
    for path in sources(PYTHON_SOURCES):
        out += [(os.path.relpath(path, ROOT), *hit) for hit in scan_python(path)]
    return out


# ---------------------------------------------------------------------------------------- the tests

class InstallDepsTest(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        cls.entries = read_programs()
        cls.base_list = install_deps_packages()
        cls.test_list = install_deps_packages("--test")
        cls.dpkg = Dpkg()
        # What a fresh machine has after `install-deps.sh --test` (or without --test).
        cls.provided = cls.dpkg.closure(cls.test_list | cls.dpkg.base)
        cls.base_provided = cls.dpkg.closure(cls.base_list | cls.dpkg.base)

    def test_the_lists_read(self):
        self.assertLessEqual(self.base_list, self.test_list, "--test adds to the base list")
        self.assertIn("podman", self.test_list)
        self.assertGreater(len(self.entries), 20)
        self.assertEqual(len({e.program for e in self.entries}), len(self.entries),
                         "scripts/test-programs.txt lists a program twice")

    def test_every_program_comes_with_install_deps(self):
        missing = [f"scripts/test-programs.txt:{e.line}: {e.program} (package {e.package})"
                   for e in self.entries if not e.optional and e.package not in self.provided]
        self.assertEqual(missing, [], "programs the tests run whose package scripts/install-deps.sh --test does "
                         "not install (neither listed there nor a dependency of a listed package, nor in every "
                         "Debian system): add the package to install-deps.sh's --test list")

    def test_every_program_is_there(self):
        missing = [f"scripts/test-programs.txt:{e.line}: {e.program}" for e in self.entries
                   if not e.optional and not locate(e.program)]
        self.assertEqual(missing, [], "programs not found on PATH or in /usr/sbin after scripts/install-deps.sh "
                         "--test (run it, or fix the name)")

    def test_each_program_is_its_package(self):
        wrong = []
        for e in self.entries:
            if not self.dpkg.installed(e.package):
                continue  # e.g. npm from a NodeSource Node.js: Debian's npm is then not installed
            files = self.dpkg.files(e.package)
            places = locate(e.program)
            if places and not any(hop in files for p in places for hop in link_chain(p)):
                wrong.append(f"scripts/test-programs.txt:{e.line}: {e.program} is {places[0]}, which package "
                             f"{e.package} does not ship (dpkg -S {os.path.realpath(places[0])})")
        self.assertEqual(wrong, [])

    def test_the_sources_run_no_unlisted_program(self):
        listed = {e.name for e in self.entries}
        base_programs = self.dpkg.base_programs()
        self.assertIn("timeout", base_programs, "the programs of Essential and required packages are read")
        found = scan()
        self.assertGreater(len(found), 30, "the scan sees the sources' commands")
        seen = {name for _, _, name, _ in found}
        for expected in ("podman", "curl", "nghttp", "redis-server", "clang-format", "debootstrap", "h2load", "wrk"):
            self.assertIn(expected, seen, f"the scan sees {expected}")
        unlisted = sorted({f"{path}:{line}: `{name}` ({how})" for path, line, name, how in found
                           if name not in listed and name not in ALLOWED and name not in base_programs})
        self.assertEqual(unlisted, [], "programs the sources run that scripts/test-programs.txt does not list: add "
                         "`program package  # who runs it` there and the package to scripts/install-deps.sh "
                         "--test (or, for a shell builtin or this project's own program, to ALLOWED in "
                         "integration/test_install_deps.py)")

    def test_run_sh_needs_only_the_base_list(self):
        by_name = {e.name: e for e in self.entries}
        base_files = {os.path.normpath(p) for p in BASE_SOURCES}
        missing = sorted({f"{path}:{line}: `{name}` (package {by_name[name].package})"
                          for path, line, name, _ in scan()
                          if path in base_files and name in by_name and not by_name[name].optional
                          and by_name[name].package not in self.base_provided})
        self.assertEqual(missing, [], "scripts/run.sh installs without --test: these packages belong in "
                         "scripts/install-deps.sh's base list")


class ScanTest(unittest.TestCase):
    """The scan sees what it must (a new program fails the check) and no more."""

    def shell(self, text: str) -> list[str]:
        with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:
            f.write(text)
            f.flush()
            return [name for _, name, _ in scan_shell(f.name)]

    def python(self, text: str) -> list[str]:
        with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
            f.write(text)
            f.flush()
            return [name for _, name, _ in scan_python(f.name)]

    def test_shell(self):
        self.assertEqual(self.shell('nghttpd -v 8080 key cert\n'), ["nghttpd"])
        self.assertEqual(self.shell('x=$(dirname "$(readlink -f "$0")")  # comment: curl\n'), ["dirname", "readlink"])
        self.assertEqual(self.shell('A=1 B="x y" timeout 900 ./build/bin/t && taskset -c 0 h2load -n 1 "$u"\n'),
                         ["timeout", "taskset", "h2load"])
        self.assertEqual(self.shell('"${sudo_cmd[@]}" apt-get update\n[ -n "$(id -u)" ] || arr=(sudo x)\n'),
                         ["apt-get", "[", "id"])
        self.assertEqual(self.shell('command -v ccache >/dev/null && echo "a (b); c $(( 1 + 2 )) d"\n'),
                         ["command", "ccache", "echo"])
        self.assertEqual(self.shell("cat <<'EOF'\ncurl x\nEOF\nf() {\n  wrk \\\n    -t1\n}\nf\n"), ["cat", "wrk"])
        self.assertEqual(self.shell('for p in $(seq 3); do kill "$p"; done\nif ! grep -q x y; then :; fi\n'),
                         ["seq", "kill", "grep"])
        self.assertEqual(self.shell('targets=(fuzz_a\n  fuzz_b)\npackages+=(\n  curl wrk\n)\nnghttpd -v\n'), ["nghttpd"])

    def test_python(self):
        self.assertEqual(self.python('subprocess.run(["nghttpd", "-v"])\n'), ["nghttpd"])
        self.assertEqual(self.python('argv = ["taskset", "-c", "0", "wrk", "-t1"]\n'), ["taskset", "wrk"])
        self.assertEqual(self.python('def run(*cmd):\n    return subprocess.run(cmd)\n'
                                     'run("podman", "exec", c, "sh", "-c", "id")\n'), ["podman"])
        self.assertEqual(self.python('def run(*a):\n    subprocess.run([b("q"), *a])\nrun("over_limit", "-x")\n'), [])
        self.assertEqual(self.python('for c, f in (("c1", "--http1.1"),):\n    pass\ncall("alice-key")\n'), [])
        self.assertEqual(self.python('shutil.which("promtool")\nsubprocess.run([sys.executable, "x.py"])\n'),
                         ["promtool"])
        self.assertEqual(self.python('for t in ("nginx", "wrk"):\n    if not shutil.which(t):\n        pass\n'),
                         ["nginx", "wrk"])
        self.assertEqual(self.python('identify = ["header:X-Key", "ip"]\nnames = ["a", "b"]\n'), [])


if __name__ == "__main__":
    unittest.main()
