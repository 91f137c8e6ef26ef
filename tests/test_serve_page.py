"""The chat page of `specli serve` in a real headless browser: the Linux distribution's Chromium, driven by
Selenium through the distribution's chromedriver (nothing is downloaded). Skips with the reason when
either is missing (`apt-get install chromium chromium-driver`; .ci/run installs them where it can).
Every wait is on something the page shows, bounded."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from serve_support import ServerProcess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT = 90  # seconds for anything the page should show (a busy 2-core machine)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,900")


@pytest.fixture
def browser(tmp_path: Path):
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no Chromium/chromedriver on this machine (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver, condition, what: str):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(condition)
    except TimeoutException:
        raise AssertionError(f"the page never showed {what}") from None


def _send(driver, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.ID, "message")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)  # Enter sends, as in a chat app


def _replies(driver):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, ".turn.assistant")


def test_a_reply_streams_in_colour_with_stats_and_stop_stops_it(fixture_models, tmp_path, browser) -> None:
    from selenium.webdriver.common.by import By

    with ServerProcess("--target", str(fixture_models.target_with_template), "--draft",
                       str(fixture_models.draft), "-t", "1", "-c", "8192", "-n", "8000", "--ignore-eos",
                       cwd=tmp_path) as server:
        server.ready()
        browser.get(server.url + "/")
        _wait(browser, lambda d: "fixture-target-chat" in d.find_element(By.ID, "model").text, "the model")
        legend = browser.find_element(By.ID, "legend").text
        assert "accepted draft" in legend and "target's correction" in legend and "bonus" in legend

        # A whole reply: k and max tokens from the page's controls.
        browser.find_element(By.ID, "draft-max").send_keys("3")
        browser.find_element(By.ID, "max-tokens").send_keys("30")
        _send(browser, "Once upon a <b>time</b>")
        first = _wait(browser, lambda d: next((r for r in _replies(d) if r.find_element(
            By.CLASS_NAME, "stats").text), None), "a stats line")
        stats = first.find_element(By.CLASS_NAME, "stats").text
        assert "30 tokens" in stats and "tok/s" in stats and "acceptance" in stats and "drafted" in stats
        tokens = first.find_elements(By.CSS_SELECTOR, ".reply span.tok")
        kinds = {t.get_attribute("class").split()[1] for t in tokens}
        assert "accepted" in kinds and kinds <= {"accepted", "corrected", "bonus", "plain"}
        accepted = next(t for t in tokens if "accepted" in t.get_attribute("class"))
        assert accepted.value_of_css_property("color") == "rgba(95, 212, 127, 1)"  # the terminal's green
        assert first.find_element(By.CLASS_NAME, "reply").text == "".join(t.text for t in tokens)
        user = browser.find_elements(By.CSS_SELECTOR, ".turn.user .text")[0]
        assert user.text == "Once upon a <b>time</b>"  # shown as written, never as HTML

        # A reply without a length limit (the server's -n 8000, no end of text): stopped from the page.
        browser.find_element(By.ID, "max-tokens").clear()
        start = len(server.lines)
        _send(browser, "The dog")
        _wait(browser, lambda d: len(_replies(d)) == 2 and len(_replies(d)[1].find_elements(
            By.CSS_SELECTOR, ".reply span.tok")) >= 5, "the second reply streaming")
        browser.find_element(By.ID, "stop").click()
        second = _wait(browser, lambda d: "stopped" in _replies(d)[1].find_element(
            By.CLASS_NAME, "stats").text and _replies(d)[1], "the stopped reply's stats line")
        assert "acceptance" in second.find_element(By.CLASS_NAME, "stats").text
        line = server.wait_for(r"· (\d+) tokens · .*stop: interrupted \(cancelled\)", start=start)
        assert int(line.group(1)) < 8000  # stopped on the server, not only in the page
        _wait(browser, lambda d: d.find_element(By.ID, "send").is_enabled(), "the send button back")

        # k = 0 with a drafter loaded: nothing drafted, and no reason from auto (it was not asked).
        browser.find_element(By.ID, "draft-max").clear()
        browser.find_element(By.ID, "draft-max").send_keys("0")
        browser.find_element(By.ID, "max-tokens").send_keys("5")
        _send(browser, "The cat")
        third = _wait(browser, lambda d: len(_replies(d)) == 3 and _replies(d)[2].find_element(
            By.CLASS_NAME, "stats").text and _replies(d)[2], "the third reply's stats line")
        stats = third.find_element(By.CLASS_NAME, "stats").text
        assert "5 tokens" in stats and "acceptance n/a (0/0 drafted)" in stats and "auto:" not in stats
        assert server.stop() == 0


def test_the_page_asks_for_the_api_key(fixture_models, tmp_path, browser) -> None:
    from selenium.webdriver.common.by import By

    with ServerProcess("--target", str(fixture_models.target), "--no-draft", "-t", "1", "-n", "12",
                       cwd=tmp_path, env={"SPECLI_API_KEY": "s3cret"}) as server:
        server.ready()
        browser.get(server.url + "/")
        _wait(browser, lambda d: d.find_element(By.ID, "key-bar").is_displayed(), "the API key field")
        browser.find_element(By.ID, "api-key").send_keys("wrong")
        browser.find_element(By.ID, "use-key").click()
        _wait(browser, lambda d: "refused" in d.find_element(By.ID, "key-error").text, "the key refused")
        key = browser.find_element(By.ID, "api-key")
        key.clear()
        key.send_keys("s3cret")
        browser.find_element(By.ID, "use-key").click()
        _wait(browser, lambda d: "fixture-target" in d.find_element(By.ID, "model").text, "the model")
        assert not browser.find_element(By.ID, "key-bar").is_displayed()
        assert not browser.find_element(By.ID, "legend").is_displayed()  # no drafter, no legend
        _send(browser, "Once upon a time")
        reply = _wait(browser, lambda d: next((r for r in _replies(d) if r.find_element(
            By.CLASS_NAME, "stats").text), None), "a stats line")
        assert "12 tokens" in reply.find_element(By.CLASS_NAME, "stats").text
        kinds = {t.get_attribute("class") for t in reply.find_elements(By.CSS_SELECTOR, "span.tok")}
        assert kinds == {"tok plain"}
        assert server.stop() == 0


def test_a_base_model_is_named_one_and_continues_text(fixture_models, tmp_path, browser) -> None:
    """A GGUF without a chat template (most likely a base model): the page says so, starts in "continue
    text" mode (the text goes to /v1/completions, no conversation), offers an example a base model
    continues well, and still chats on request."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    with ServerProcess("--target", str(fixture_models.target), "--draft", "ngram", "-t", "1", "-n", "40",
                       "--temp", "0", cwd=tmp_path) as server:
        server.ready()
        browser.get(server.url + "/")
        note = _wait(browser, lambda d: d.find_element(By.ID, "base-note").is_displayed()
                     and d.find_element(By.ID, "base-note"), "the base-model note")
        assert "no chat template" in note.text and "continue text" in note.text
        mode = Select(browser.find_element(By.ID, "mode"))
        assert mode.first_selected_option.get_attribute("value") == "continue"
        browser.find_element(By.ID, "example").click()
        assert browser.find_element(By.ID, "message").get_attribute("value").startswith("Day 1:")
        start = len(server.lines)
        browser.find_element(By.ID, "send").click()
        reply = _wait(browser, lambda d: next((r for r in _replies(d) if r.find_element(
            By.CLASS_NAME, "stats").text), None), "the continuation's stats line")
        stats = reply.find_element(By.CLASS_NAME, "stats").text
        assert "40 tokens" in stats and "nothing drafted" not in stats
        # -k auto either drafted (its acceptance) or says why it did not.
        assert re.search(r"acceptance \d+% \(\d+/[1-9]\d* drafted\)", stats) or " · auto: " in stats, stats
        assert reply.find_elements(By.CSS_SELECTOR, ".reply span.tok")
        server.wait_for(r"^specli: cmpl-\w+: ", start=start)  # a text completion, not a chat turn

        # A text n-gram lookup has nothing to copy from (the first 12 tokens repeat nothing): auto decodes
        # it plainly and the stats line says why, in the correction's yellow.
        browser.find_element(By.ID, "max-tokens").send_keys("12")
        _send(browser, "Once upon a time")
        plain = _wait(browser, lambda d: len(_replies(d)) == 2 and _replies(d)[1].find_element(
            By.CLASS_NAME, "stats").text and _replies(d)[1], "the plain reply's stats line")
        stats = plain.find_element(By.CLASS_NAME, "stats").text
        # (no drafted acceptance; auto's reason may quote the acceptance it expects)
        assert "12 tokens" in stats and "nothing drafted" not in stats
        assert not re.search(r"acceptance \d+% \(", stats), stats
        reason = plain.find_element(By.CSS_SELECTOR, ".stats .auto")
        assert reason.text.startswith("auto: ") and len(reason.text) > len("auto: ") and reason.text in stats
        assert reason.value_of_css_property("color") == "rgba(229, 192, 75, 1)"  # the terminal's yellow
        assert {t.get_attribute("class") for t in plain.find_elements(By.CSS_SELECTOR, "span.tok")} == {
            "tok plain"}
        mode.select_by_value("chat")
        start = len(server.lines)
        _send(browser, "Once upon a time")
        _wait(browser, lambda d: len(_replies(d)) == 3 and _replies(d)[2].find_element(
            By.CLASS_NAME, "stats").text, "the chat reply's stats line")
        server.wait_for(r"^specli: chatcmpl-\w+: ", start=start)
        assert server.stop() == 0
