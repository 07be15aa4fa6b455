"""Gradient vector fields (2nd-order paper §4-5): closed forms vs an actual jax.grad step."""

import subprocess
import sys

import numpy as np
import pytest

from dml_jax.analysis import common
from dml_jax.analysis import vector_field as vf


@pytest.mark.parametrize("loss", vf.LOSSES)
@pytest.mark.parametrize("gamma", [0.5, -0.3, 1.0])
def test_closed_form_equals_autodiff_step(loss, gamma):
  s_ap, s_an = vf.similarity_grid(num=9, low=-0.9, high=1.0)
  for lr in (0.1, 0.5):
    c_ap, c_an = vf.closed_form_step(s_ap, s_an, loss=loss, gamma=gamma, learning_rate=lr)
    a_ap, a_an = vf.autodiff_step(s_ap, s_an, loss=loss, gamma=gamma, learning_rate=lr)
    np.testing.assert_allclose(np.asarray(a_ap), c_ap, atol=2e-5)
    np.testing.assert_allclose(np.asarray(a_an), c_an, atol=2e-5)
    assert np.abs(c_ap).max() > 1e-3   # a real step, not a trivially zero field


def test_temperature_and_hinge_options_match_autodiff():
  s_ap, s_an = vf.similarity_grid(num=7)
  for loss in ("nca", "nca_2nd"):
    c = vf.closed_form_step(s_ap, s_an, loss=loss, gamma=0.5, temperature=0.5)
    a = vf.autodiff_step(s_ap, s_an, loss=loss, gamma=0.5, temperature=0.5)
    np.testing.assert_allclose(np.asarray(a[0]), c[0], atol=2e-5)
  c = vf.closed_form_step(s_ap, s_an, loss="triplet", gamma=0.5, triplet_margin=0.2)
  a = vf.autodiff_step(s_ap, s_an, loss="triplet", gamma=0.5, triplet_margin=0.2)
  np.testing.assert_allclose(np.asarray(a[1]), c[1], atol=2e-5)
  inactive = 2 * (s_an - s_ap) + 0.2 <= 0
  assert inactive.any() and np.all(c[0][inactive] == 0)


def test_paper_equations_7_8_first_order():
  # Eqs. 7-8 and 20-22 written out literally at one point.
  s_ap, s_an, g, alpha = 0.7, 0.4, 0.5, 0.3
  beta = alpha * np.exp(s_an) / (np.exp(s_ap) + np.exp(s_an))
  s_pn = s_ap * s_an + g * np.sqrt(1 - s_ap ** 2) * np.sqrt(1 - s_an ** 2)
  new_ap = (1 + beta ** 2) * s_ap + 2 * beta - beta * s_pn - beta ** 2 * s_an
  new_an = (1 + beta ** 2) * s_an - 2 * beta + beta * s_pn - beta ** 2 * s_ap
  np_ = np.sqrt((1 + beta * s_ap) ** 2 + beta ** 2 * (1 - s_ap ** 2))
  nn = np.sqrt((1 - beta * s_an) ** 2 + beta ** 2 * (1 - s_an ** 2))
  na = np.sqrt((1 + beta * s_ap - beta * s_an) ** 2
               + (beta * np.sqrt(1 - s_ap ** 2) - g * beta * np.sqrt(1 - s_an ** 2)) ** 2
               + (beta * np.sqrt(1 - g ** 2) * np.sqrt(1 - s_an ** 2)) ** 2)
  d_ap, d_an = vf.closed_form_step(s_ap, s_an, loss="nca", gamma=g, learning_rate=alpha)
  assert d_ap == pytest.approx(new_ap / (na * np_) - s_ap, abs=1e-12)
  assert d_an == pytest.approx(new_an / (na * nn) - s_an, abs=1e-12)


def test_entanglement_and_paper_claims():
  f1 = vf.vector_field(loss="nca", gamma=0.5, p=0.8, num=21)
  d_ap, d_an = f1["d_ap"], f1["d_an"]
  q = 0.8 * np.sqrt(f1["s_ap"] * f1["s_an"])
  np.testing.assert_allclose(f1["total_ap"], d_ap + q * d_an)
  np.testing.assert_allclose(f1["total_an"], d_an + q * d_ap)
  # Problem 1 (§4): with entanglement, hard negatives (S_an near 1) move up under L^1st.
  assert f1["total_an"][-1, 2:10].min() > 0
  # Problem 2: easy positives (S_ap near 1) move apart without entanglement (dS_ap < 0).
  assert d_ap[:5, -1].max() < 0


def test_errors():
  with pytest.raises(ValueError, match="loss"):
    vf.closed_form_step(0.5, 0.5, loss="nope", gamma=0.5)
  with pytest.raises(ValueError, match="gamma"):
    vf.closed_form_step(0.5, 0.5, loss="nca", gamma=2.0)
  with pytest.raises(ValueError, match="p must"):
    vf.entangle(0.1, 0.1, 0.5, 0.5, p=-1)


def test_cli_writes_png(tmp_path):
  assert vf.main([f"--workdir={tmp_path}", "--losses=nca,triplet", "--p=0.4", "--num=11"]) == 0
  png = tmp_path / "vector_field_gamma0.5.png"
  assert png.stat().st_size > 1000


def test_cli_bad_flag_is_one_line(tmp_path):
  run = subprocess.run([sys.executable, "-m", "dml_jax.analysis.vector_field",
                        f"--workdir={tmp_path}", "--gamma=2"], capture_output=True, text=True)
  assert run.returncode == 1
  assert "Traceback" not in run.stderr
  assert run.stderr.startswith("python -m dml_jax.analysis.vector_field: ")
  assert len(run.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", ["--losses=nope", "--p=-1", "--num=1"])
def test_other_bad_flags_are_one_line(tmp_path, flag, capsys):
  # what the module's __main__ runs (the subprocess above), in this process
  program = "python -m dml_jax.analysis.vector_field"
  assert common.run(lambda: vf.main([f"--workdir={tmp_path}", flag]), program) == 1
  err = capsys.readouterr().err
  assert err.startswith(f"{program}: ") and len(err.strip().splitlines()) == 1
  assert not list(tmp_path.iterdir())
