"""The studio's optional password and upload cap, under Streamlit's AppTest on real (empty) workspaces."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.store.workspace import Store
from studio.access import SIGNED_IN, password_matches

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "streamlit_app.py")
SECRET = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOPOOL_HOME", str(tmp_path))
    monkeypatch.delenv("EVOPOOL_PASSWORD", raising=False)
    Store.open(tmp_path / "empty")


def everything(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [t.value for t in at.title]
    parts += [a.value for kind in (at.success, at.info, at.warning, at.error) for a in kind]
    parts += [str(at.session_state[k]) for k in at.session_state._state.filtered_state]
    return "\n".join(parts)


def locked(at: AppTest) -> bool:
    """Only the sign-in form: no page header, no sidebar."""
    return len(at.text_input) == 1 and at.text_input[0].label == "Password" and not at.sidebar.selectbox


@pytest.mark.parametrize("script", ["streamlit_app.py", "pages/project.py", "pages/evolve.py", "pages/labels.py"])
def test_with_a_password_every_page_asks_for_it_first(script, monkeypatch):
    """Also a deep link (a page script run on its own, as after a reload on /evolve)."""
    monkeypatch.setenv("EVOPOOL_PASSWORD", SECRET)
    at = AppTest.from_file(str(ROOT / script), default_timeout=60)
    at.query_params["ws"] = "empty"
    at.run()
    assert not at.exception and locked(at)


def test_a_wrong_password_keeps_it_locked_and_the_right_one_opens_it(monkeypatch):
    monkeypatch.setenv("EVOPOOL_PASSWORD", SECRET)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["ws"] = "empty"
    at.run()
    at.text_input(key="sign_in_password").input("guess")
    at.button[0].click().run()
    assert locked(at) and "not right" in at.error[0].value and SIGNED_IN not in at.session_state
    at.text_input(key="sign_in_password").input(SECRET)
    at.button[0].click().run()
    assert not at.exception and not locked(at)
    assert "Files up to 500 MB" in everything(at)  # the page itself ran
    assert SECRET not in everything(at)  # neither shown nor kept in the session


def test_the_password_can_come_from_streamlit_secrets():
    at = AppTest.from_file(APP, default_timeout=60)
    at.secrets["password"] = SECRET
    at.query_params["ws"] = "empty"
    at.run()
    assert locked(at)
    at.text_input(key="sign_in_password").input(SECRET)
    at.button[0].click().run()
    assert not locked(at)


def test_without_a_password_the_studio_is_open_and_says_the_upload_limit():
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["ws"] = "empty"
    at.run()
    assert not at.exception and not locked(at)
    assert "Files up to 500 MB" in everything(at)


def test_passwords_are_compared_whole():
    assert password_matches(SECRET, SECRET)
    assert not password_matches(SECRET[:-1], SECRET) and not password_matches("", "")
    assert not password_matches(SECRET + " ", SECRET)
