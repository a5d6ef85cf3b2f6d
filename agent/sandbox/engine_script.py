"""The program the shared Docker mode's file tools run inside the thread's container.

Why a program in the container: with ``agent.sandbox.docker.shared`` the thread's files live in a
named volume on the Docker engine, which may be on another host, so the daemon has no host path to
open. Every file operation is one ``docker exec`` of this script (``python3 -I -c``: isolated, so
nothing in the workspace can shadow a module it imports) as the sandbox user, with the path passed
as an argument, never through a shell.

It keeps the rules of :class:`~agent.sandbox.files.HostFiles`: the path, links followed, must stay
inside its mount's own directory (``realpath``), and the link-free result is then opened one
component at a time relative to a directory fd with ``O_NOFOLLOW`` (``O_NONBLOCK`` too, then
``fstat``: only a regular file is read or written), so a link swapped in after the check makes the
call fail. Trees are walked with ``os.fwalk(follow_symlinks=False)``, which recurses: a tree about
1,000 levels deep (sandboxed code makes one in a line) fails a walk, a search or a delete with
the error ``deep`` (the model is told to remove it with a command), and is measured for the quota
as far as the walk got (``deep``), so it never blocks the thread's commands.

Output: one JSON line (``{"error": ...}`` or the result), then for ``read`` the file's bytes.
The daemon trusts none of it beyond its own caps (engine_files.py): the script runs beside
sandboxed code as the same user, so a hostile command could in principle tamper with it. What it
could reach then is the container's own filesystem, never the daemon's host.
"""

HELPER = r"""
import base64, errno, json, os, re, shutil, stat, sys, time
D = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
F = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
out = sys.stdout.buffer
LS_SECONDS, WALK_LOOK = 20.0, 4  # a walk looks at up to 4x the files it may keep
class Err(Exception):
    pass
def say(obj):
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()
def resolve(root, rel):
    # The mount's own dir is a plain directory of the volume here, not a mount point: sandboxed
    # code could swap it for a link. Refused, and opened with O_NOFOLLOW below (no race either).
    if os.path.realpath(root) != root:
        raise Err("outside")
    top = root
    real = os.path.realpath(os.path.join(top, rel)) if rel else top
    if real != top and not real.startswith(top + "/"):
        raise Err("outside")
    return top, [p for p in real[len(top):].split("/") if p]
def opendir(top, parts, create=False):
    fd = os.open(top, D)
    try:
        for p in parts:
            try:
                n = os.open(p, D, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(p, 0o755, dir_fd=fd)
                n = os.open(p, D, dir_fd=fd)
            os.close(fd)
            fd = n
    except BaseException:
        os.close(fd)
        raise
    return fd
def openfile(top, parts, flags, create=False):
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "is a directory")
    dfd = opendir(top, parts[:-1], create)
    try:
        fd = os.open(parts[-1], flags | F, 0o644, dir_fd=dfd)
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Err("notreg")
    return fd
def entry(st):
    d = stat.S_ISDIR(st.st_mode)
    return [d, 0 if d else st.st_size, st.st_mtime]
def chunk(c):
    # "@<n>": n raw bytes from stdin (Kubernetes, whose exec arguments travel in the URL).
    if not c.startswith("@"):
        return base64.b64decode(c)
    want, got = int(c[1:]), []
    while want > 0:
        b = sys.stdin.buffer.read(want)
        if not b:
            raise Err("EIO")
        got.append(b)
        want -= len(b)
    return b"".join(got)
def decode(chunks):
    return b"".join(chunk(c) for c in chunks)
def op_stat(root, rel):
    top, parts = resolve(root, rel)
    try:
        st = os.stat(os.path.join(top, *parts), follow_symlinks=False)
    except FileNotFoundError:
        return {"entry": None}
    return {"entry": entry(st)}
def op_ls(root, rel, most, most_looked):
    top, parts = resolve(root, rel)
    fd = opendir(top, parts)
    found, cut, looked = [], False, 0
    deadline = time.monotonic() + LS_SECONDS
    try:
        with os.scandir(fd) as it:
            for de in it:
                looked += 1  # entries left out (a dangling link) count too: 2 M of them took 85 s
                if len(found) >= int(most) or looked > int(most_looked) or time.monotonic() > deadline:
                    cut = True
                    break
                try:
                    st = de.stat(follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        t2, p2 = resolve(root, "/".join(parts + [de.name]))
                        st = os.stat(os.path.join(t2, *p2), follow_symlinks=False)
                except (OSError, Err):
                    continue
                found.append([de.name] + entry(st))
    finally:
        os.close(fd)
    return {"entries": found, "cut": cut}
def op_read(root, rel, cap, head=""):
    top, parts = resolve(root, rel)
    fd = openfile(top, parts, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        say({"size": size})
        if size > int(cap) and not head:  # a whole-file read, refused by size: nothing to send
            return None
        left = int(cap) + 1  # "head": the first bytes even of a larger file (read_file's lines)
        while left > 0:
            b = f.read(min(left, 1 << 20))
            if not b:
                break
            out.write(b)
            left -= len(b)
    return None
def op_write(root, rel, mode, *chunks):
    top, parts = resolve(root, rel)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "append" else os.O_TRUNC)
    fd = openfile(top, parts, flags, create=True)
    with os.fdopen(fd, "wb") as f:
        f.write(decode(chunks))
    return {"ok": True}
def names(name):
    yield name
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        stem, ext = name, ""
    for n in range(2, 1001):
        yield "%s-%d.%s" % (stem, n, ext) if ext else "%s-%d" % (stem, n)
def op_create(root, rel, name, *chunks):
    top, parts = resolve(root, rel)
    dfd = opendir(top, parts, create=True)
    try:
        for cand in names(name):
            try:
                fd = os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_EXCL | F, 0o644, dir_fd=dfd)
            except FileExistsError:
                continue
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(decode(chunks))
            except BaseException:
                os.unlink(cand, dir_fd=dfd)
                raise
            return {"name": cand}
    finally:
        os.close(dfd)
    raise Err("toomany")
def op_delete(root, rel):
    # The last component is the thing named, never followed: deleting a link removes the link
    # (resolving the whole path removed its target, and refused a link pointing outside).
    head, _, last = rel.rpartition("/")
    if not last or last in (".", ".."):
        raise Err("mountroot")
    top, parts = resolve(root, head)
    dfd = opendir(top, parts)
    try:
        st = os.stat(last, dir_fd=dfd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(last, dir_fd=dfd)
        else:
            os.unlink(last, dir_fd=dfd)
    finally:
        os.close(dfd)
    return {"ok": True}
def islink(name, dfd):
    # os.fwalk lists a link to a directory among the dirs and opens it, following it, before it
    # finds it is not one to descend: pruned first, so nothing is ever opened through a link.
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return True
def walk(root, rel, most, seconds):
    top, parts = resolve(root, rel)
    deadline = time.monotonic() + float(seconds)
    try:
        fd = opendir(top, parts)
    except NotADirectoryError:
        dfd = opendir(top, parts[:-1])
        yield parts[-1], parts[-1], dfd
        os.close(dfd)
        return
    seen = regular = 0
    try:
        for dirpath, dirs, files, dfd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
            dirs[:] = sorted(d for d in dirs if not islink(d, dfd))
            sub = "" if dirpath == "." else dirpath[2:] + "/"
            for name in [None] + sorted(files):  # None: the directory itself
                seen += 1  # every entry counts and is timed, not regular files only (links, FIFOs)
                if seen > WALK_LOOK * int(most) or time.monotonic() > deadline:
                    yield None, None, None
                    return
                if name is None:
                    continue
                try:
                    if not stat.S_ISREG(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                        continue
                except OSError:
                    continue
                regular += 1
                if regular > int(most):
                    yield None, None, None
                    return
                yield sub + name, name, dfd
    finally:
        os.close(fd)
def single(root, rel):
    top, parts = resolve(root, rel)
    try:
        os.close(opendir(top, parts))
    except NotADirectoryError:
        return True
    return False
def op_walk(root, rel, most, seconds):
    found, cut = [], False
    for path, _, _ in walk(root, rel, most, seconds):
        if path is None:
            cut = True
            break
        found.append(path)
    return {"files": found, "cut": cut, "single": single(root, rel)}
def op_grep(root, rel, prefix, rx, inc, base, most, seconds, total, per_file, width, count):
    rx, want = re.compile(rx), re.compile(inc) if inc else None
    found, cut, budget = [], False, int(total)
    for path, name, dfd in walk(root, rel, most, seconds):
        if path is None:
            cut = True
            break
        shown = name if base == "1" else "/".join(p for p in (prefix, path) if p)
        if want is not None and not want.fullmatch(shown):
            continue
        try:
            fd = os.open(name, os.O_RDONLY | F, dir_fd=dfd)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > int(per_file) or st.st_size > budget:
                continue
            data = f.read(int(per_file) + 1)
        budget -= len(data)
        if b"\0" in data[:8192]:
            continue
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if rx.search(line):
                if len(found) >= int(count):
                    return {"matches": found, "cut": True, "single": single(root, rel)}
                found.append([path, n, line[: int(width)]])
    return {"matches": found, "cut": cut, "single": single(root, rel)}
def op_usage(most, *roots):
    blocks, files, seen, denied, deep = 0, 0, set(), [], False
    def failed(e):
        if isinstance(e, PermissionError):
            denied.append(1)
    for root in roots:
        try:
            fd = os.open(root, D)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            if e.errno == errno.ELOOP:
                continue  # swapped for a link: nothing of ours to count, and never followed
            raise
        try:
            for _, dirs, names_, dfd in os.fwalk(".", dir_fd=fd, follow_symlinks=False, onerror=failed):
                links = [d for d in dirs if islink(d, dfd)]  # never opened; counted as files
                dirs[:] = [d for d in dirs if d not in links]
                for name in dirs + names_ + links:
                    files += 1
                    if files > int(most):
                        return {"blocks": blocks, "files": files, "cut": True}
                    try:
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        blocks += st.st_blocks * 512
        except RecursionError:  # os.fwalk recurses: a tree ~1000 levels deep ends the walk
            deep = True
        finally:
            os.close(fd)
    return {"blocks": blocks, "files": files, "cut": False, "unreadable": bool(denied), "deep": deep}
OPS = {"stat": op_stat, "ls": op_ls, "read": op_read, "write": op_write, "create": op_create,
       "delete": op_delete, "walk": op_walk, "grep": op_grep, "usage": op_usage}
try:
    res = OPS[sys.argv[1]](*sys.argv[2:])
    if res is not None:
        say(res)
except Err as e:
    say({"error": str(e)})
except OSError as e:
    say({"error": errno.errorcode.get(e.errno or 0, "EIO"), "text": e.strerror or ""})
except (re.error, UnicodeError, ValueError) as e:
    say({"error": "invalid", "text": str(e)[:200]})
except RecursionError:
    say({"error": "deep"})
"""
