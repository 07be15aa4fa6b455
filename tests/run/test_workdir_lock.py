"""One training run per workdir: a second train.py, sweep point or --overwrite on a workdir a run
is training in is refused in one line naming the holder, and leaves the workdir byte-identical;
a killed holder locks nothing; the lock file goes with its run."""

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from dml_jax.run import training
from dml_jax.run import workdir_lock
from dml_test_support import ROOT
from dml_test_support import small_config
from dml_test_support import snapshot

HOLD = textwrap.dedent("""
    import sys, time
    from dml_jax.run import workdir_lock
    with workdir_lock.hold(sys.argv[1], program="holder"):
      print("held", flush=True)
      time.sleep(120)
""")


@pytest.fixture
def other_process():
  """``start(workdir)``: another process holding ``workdir``'s lock until the test ends."""
  procs = []

  def start(workdir):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, workdir], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    procs.append(proc)
    assert proc.stdout.readline() == "held\n"
    return proc

  yield start
  for proc in procs:
    proc.kill()
    proc.wait()


def test_the_holder_is_named_in_the_lock_file_and_a_second_hold_is_refused(tmp_path):
  workdir = str(tmp_path / "run")
  with workdir_lock.hold(workdir, program="train.py"):
    with open(workdir_lock.lock_path(workdir)) as f:
      info = json.load(f)
    assert (info["program"], info["pid"], info["host"]) == ("train.py", os.getpid(),
                                                            socket.gethostname())
    before = snapshot(workdir)
    # a second open file of the same lock conflicts, in this process too
    with pytest.raises(workdir_lock.WorkdirInUseError) as e:
      with workdir_lock.hold(workdir):
        pass
    message = str(e.value)
    assert "\n" not in message
    assert f"{workdir} is in use: train.py (pid {os.getpid()} on host " in message
    assert info["started"] in message and "another --workdir" in message
    assert snapshot(workdir) == before


def test_the_lock_file_goes_with_its_run_and_a_folder_it_created_if_empty(tmp_path):
  fresh, existing = str(tmp_path / "fresh"), str(tmp_path / "existing")
  os.makedirs(existing)
  for workdir in (fresh, existing):
    with workdir_lock.hold(workdir):
      assert os.listdir(workdir) == [workdir_lock.LOCK_FILE]
  assert not os.path.exists(fresh)          # nothing was written: no empty folder left
  assert os.listdir(existing) == []
  kept = str(tmp_path / "kept")
  with workdir_lock.hold(kept):
    with open(os.path.join(kept, "config.json"), "w") as f:
      f.write("{}")
  assert os.listdir(kept) == ["config.json"]   # written there: the folder stays


def test_train_and_evaluate_is_refused_while_another_process_trains_there(run20_copy,
                                                                          other_process):
  copy = run20_copy
  proc = other_process(copy)
  before = snapshot(copy)
  for overwrite in (False, True):
    with pytest.raises(workdir_lock.WorkdirInUseError) as e:
      training.train_and_evaluate(small_config(40), copy, show_progress=False,
                                  overwrite=overwrite)
    assert f"holder (pid {proc.pid} on host" in str(e.value)
    assert snapshot(copy) == before   # --overwrite deleted nothing of the run in progress


@pytest.mark.slow
def test_train_py_beside_a_run_in_progress_is_one_line_and_changes_nothing(run20_copy,
                                                                           other_process):
  copy = run20_copy
  other_process(copy)
  before = snapshot(copy)
  out = subprocess.run([sys.executable, "train.py", "--config=configs/digits_evenodd_eps.py",
                        f"--workdir={copy}", "--config.num_train_steps=40", "--overwrite"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert out.returncode == 1, out.stderr[-2000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(f"train.py: {copy} is in use: holder (pid "), out.stderr[-2000:]
  assert "Traceback" not in out.stderr
  assert snapshot(copy) == before


def test_a_killed_holder_locks_nothing(tmp_path, other_process):
  workdir = str(tmp_path / "run")
  proc = other_process(workdir)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert os.path.exists(workdir_lock.lock_path(workdir))   # left behind, but unlocked
  with workdir_lock.hold(workdir):
    with open(workdir_lock.lock_path(workdir)) as f:
      assert json.load(f)["pid"] == os.getpid()
  assert not os.path.exists(workdir_lock.lock_path(workdir))


def test_a_lock_file_removed_by_its_holder_while_opened_is_opened_again(tmp_path, monkeypatch):
  """The holder removes the file as it releases it; a run that opened the old file just before
  then locks a file no longer at the path, where a third run may lock a new one: it must open
  the path again."""
  workdir = str(tmp_path)
  path = workdir_lock.lock_path(workdir)
  flock, calls = workdir_lock.fcntl.flock, []

  def flock_after_a_release(fd, op):
    calls.append(fd)
    if len(calls) == 1:   # the holder released the file this run just opened; a third run
      os.remove(path)     # created a new one
      with open(path, "w") as f:
        f.write("{}")
    return flock(fd, op)

  monkeypatch.setattr(workdir_lock.fcntl, "flock", flock_after_a_release)
  fd, other = workdir_lock.acquire(workdir, "train.py")
  assert other is None and len(calls) == 2
  assert os.fstat(fd).st_ino == os.stat(path).st_ino
  with open(path) as f:
    assert json.load(f)["pid"] == os.getpid()
  workdir_lock.release(workdir, fd)
  assert not os.path.exists(path)


@pytest.mark.parametrize("where", ["file system", "system"])
def test_without_file_locks_a_warning_says_so_and_training_goes_on(tmp_path, monkeypatch, caplog,
                                                                   where):
  def no_locks(fd, op):
    raise OSError(errno.ENOLCK, "No locks available")

  if where == "file system":
    monkeypatch.setattr(workdir_lock.fcntl, "flock", no_locks)
  else:   # no fcntl module (not a POSIX system)
    monkeypatch.setattr(workdir_lock, "fcntl", None)
  workdir = str(tmp_path / "run")
  with caplog.at_level("WARNING"):
    with workdir_lock.hold(workdir, program="train.py"):
      assert os.path.isdir(workdir)
  why = "flock: No locks available" if where == "file system" else "this system has no fcntl"
  assert f"{workdir} cannot be locked ({why}): train.py cannot tell whether" in caplog.text


def test_a_workdir_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
  open_ = os.open

  def read_only(path, *args, **kwargs):
    if path.endswith(workdir_lock.LOCK_FILE):
      raise OSError(errno.EROFS, "Read-only file system", path)
    return open_(path, *args, **kwargs)

  monkeypatch.setattr(os, "open", read_only)
  workdir = str(tmp_path / "run")
  with pytest.raises(ValueError, match=r"^the workdir .* cannot be written \(Read-only file "
                     r"system\); train.py keeps its checkpoints and results there\. Give a "
                     r"writable --workdir\.$"):
    with workdir_lock.hold(workdir, program="train.py"):
      pass
  assert not os.path.exists(workdir)


@pytest.mark.parametrize("refused", [False, True])
def test_other_processes_follow_process_0(tmp_path, monkeypatch, refused):
  """Multi-host: only process 0 locks; the others go on or stop as it says (a collective, so
  that none waits for a process that stopped)."""
  monkeypatch.setattr(workdir_lock.jax, "process_index", lambda: 1)
  monkeypatch.setattr(workdir_lock, "agree", lambda flag: refused)
  workdir = str(tmp_path / "run")
  if refused:
    with pytest.raises(workdir_lock.WorkdirInUseError, match="process 0 refused it"):
      with workdir_lock.hold(workdir):
        pass
  else:
    with workdir_lock.hold(workdir):
      assert not os.path.exists(workdir)   # process 0 creates and locks it


def test_a_holder_still_writing_its_name_is_waited_for_briefly(tmp_path, monkeypatch):
  path = str(tmp_path / workdir_lock.LOCK_FILE)
  with open(path, "w"):   # locked, not yet written
    pass
  sleep = workdir_lock.time.sleep

  def the_holder_writes(seconds):
    with open(path, "w") as f:
      f.write('{"program": "train.py", "pid": 12, "host": "h", "started": "now"}')
    sleep(seconds)

  monkeypatch.setattr(workdir_lock.time, "sleep", the_holder_writes)
  assert workdir_lock.holder(path) == "train.py (pid 12 on host h, started now)"
  with open(path, "w") as f:
    f.write("not json")
  monkeypatch.setattr(workdir_lock.time, "sleep", lambda seconds: None)
  assert workdir_lock.holder(path) == "another process"


def test_the_program_is_named_as_it_was_started():
  from dml_jax.run import experiments  # pylint: disable=import-outside-toplevel
  assert workdir_lock.this_program(experiments.__file__) == "python -m dml_jax.run.experiments"
  assert workdir_lock.this_program(os.path.join(ROOT, "train.py")) == "train.py"
  assert workdir_lock.this_program("") == "python"
