"""The playground page in headless Chromium (Debian's chromium + chromium-driver, driven by
selenium): it streams a job to the end, and a reload mid-stream resumes the same job with
Last-Event-ID, showing every token once."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.conftest import SMOL
from tokenq.cli.stack import Stack

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    profile = tempfile.mkdtemp(prefix="tokenq-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def text(driver: webdriver.Chrome, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def test_page_streams_a_job_and_resumes_after_reload(stack: Stack, browser: webdriver.Chrome,
                                                     client: httpx.Client) -> None:
    browser.get(f"{stack.url}/playground")
    wait = WebDriverWait(browser, 120, poll_frequency=0.05)
    wait.until(lambda d: SMOL in [o.text for o in Select(d.find_element(By.ID, "model")).options])
    Select(browser.find_element(By.ID, "model")).select_by_visible_text(SMOL)
    box = browser.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys("Write a long story about a lighthouse keeper and a storm.")
    tokens = browser.find_element(By.ID, "max-tokens")
    tokens.clear()
    tokens.send_keys("200")
    browser.find_element(By.ID, "start").click()
    wait.until(lambda d: int(text(d, "token-count")) >= 3)
    job_id = text(browser, "job-id")
    assert job_id.startswith("job_")
    before = int(text(browser, "token-count"))
    browser.refresh()  # mid-stream: the page must pick the same job up where it was
    wait.until(lambda d: text(d, "status").startswith(("done", "error", "cancelled")))
    assert text(browser, "status") == "done"
    assert text(browser, "resumes") == "1"
    assert text(browser, "job-id") == job_id
    record = client.get(f"/v1/jobs/{job_id}").json()
    assert record["status"] == "succeeded"
    n = record["usage"]["completion_tokens"]
    assert n > before, "the job ended before the reload: nothing was resumed"
    assert int(text(browser, "token-count")) == n
    # every token once, in order: the page's text is exactly the job's output
    shown = browser.execute_script(
        "return JSON.parse(localStorage.getItem('tokenq.playground.job')).text")
    assert shown == record["output"]
    assert "ms" in text(browser, "ttft")


def test_page_is_off_with_the_setting(stack: Stack) -> None:
    from fastapi.testclient import TestClient

    from tokenq.api.app import create_app
    from tokenq.shared.settings import Settings
    from tokenq.shared.settings_roles import ApiSettings

    off = create_app(Settings(redis_url=stack.redis_url, api=ApiSettings(playground=False)))
    on = create_app(Settings(redis_url=stack.redis_url))
    assert TestClient(off).get("/playground").status_code == 404
    page = TestClient(on).get("/playground")
    assert page.status_code == 200 and "tokenq playground" in page.text
