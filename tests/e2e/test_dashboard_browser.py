"""The dashboard in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`) via selenium.

The dashboard serves a ledger of sealed receipts and the nodes it discovers, and the page must
show what the JSON API and the ledger say: node counts by role, a contributor's credit, a
rejected rollout's reason; then it must update by itself when a receipt is added. The default
test serves discovered records in process; the slow one runs `hivenet dashboard` as a process
against a seed and two nodes started as processes (a real DHT). Screenshots are saved under the test's tmp_path and copied to
tests/artifacts/ (git-ignored) so a person can look at them; their paths are printed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.dashboard import DashboardData, DashboardServer, parse_peer, peer_text
from node.identity import create_identity
from node.ledger import Ledger
from node.swarm import LocalSwarm, wait_until
from tests.helpers import receipts
from tests.helpers.dashboard import DashboardRun, build_run
from tests.helpers.dashboard_training import rewarded_verdict, training_round
from tests.helpers.paths import REPO
from tests.helpers.receipts import RUN, new_peer

ARTIFACTS = REPO / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # the test extra installs it
    webdriver = None  # type: ignore[assignment]

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None or webdriver is None,
    reason="needs Debian's chromium and chromium-driver and the selenium package "
    "(apt-get install -y chromium chromium-driver; pip install -e .[test]); .ci/run installs them",
)


def fetch(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1400,2000", "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    assert driver.save_screenshot(str(path)), f"no screenshot written to {path}"
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(path, ARTIFACTS / name)
    print(f"dashboard screenshot: {path} (copied to {ARTIFACTS / name})")


def table_rows(driver: Any, rows_css: str) -> list[list[str]]:
    """The cell texts of every row matching `rows_css`, read in one script call: the page redraws its
    tables (replacing their rows) on live updates, so rows found one call and read the next may be gone."""
    script = "return Array.from(document.querySelectorAll(arguments[0]), (row) => Array.from(row.cells, (c) => c.textContent.trim()));"
    rows: list[list[str]] = driver.execute_script(script, rows_css)
    return rows


def leaderboard_cells(driver: Any, peer: str) -> list[str]:
    """The cells of a contributor's leaderboard row, read in one script call (the page may redraw meanwhile)."""
    script = """
        const link = document.querySelector(`#leaderboard a[href='/node/${arguments[0]}']`);
        return link ? Array.from(link.closest('tr').cells, (cell) => cell.textContent) : [];
    """
    cells: list[str] = driver.execute_script(script, peer)
    assert cells, f"{peer} is not on the leaderboard"
    return cells


def check_page(driver: Any, url: str, ledger: Ledger, run: DashboardRun, worker: str, tmp_path: Path) -> None:
    """The page against the JSON API and the ledger, its live update, the node page; screenshots."""
    worker_bytes = parse_peer(worker)
    ledger.add_many(
        [
            _verdict(run, "val-a", worker_bytes, 64),
            _verdict(run, "val-b", worker_bytes, 32, reason="sampling", ban_s=600),
            *_training_round(run, step=6, losses=(3.0, 3.4)),
            *_training_round(run, step=7, losses=(2.8, 3.0)),
        ]
    )
    swarm = fetch(url + "api/swarm")

    def board() -> dict[str, Any]:
        return {row["peer_id"]: row for row in fetch(url + "api/leaderboard")["rows"]}

    # the dashboard re-counts its ledger at most every `count_ttl_s`: receipts just added show within it
    assert wait_until(lambda: worker in board(), timeout_s=10)
    api_board = board()
    credit = ledger.credit(trusted=run.trusted).contributors[worker_bytes]
    assert api_board[worker]["total"] == credit.total
    name = api_board[worker]["name"]

    driver.get(url)
    wait = WebDriverWait(driver, 30)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    wait.until(lambda d: d.find_element(By.ID, "live").text == "live")
    assert not driver.find_element(By.ID, "node-page").is_displayed()
    assert driver.find_element(By.ID, "node-count").text == str(swarm["nodes"])
    roles = {
        e.get_attribute("data-role"): e.text for e in driver.find_elements(By.CSS_SELECTOR, "#by-role .role")
    }
    assert roles == {role: f"{role} {n}" for role, n in swarm["by_role"].items()}
    # the worker's row: its 64 tokens accepted just now (per minute of the last ten), policy version 3
    # of those verdicts, and the reachability its record reports
    wait.until(lambda d: swarm_cells(d, worker)[7] == "v3")
    listed = next(n for n in fetch(url + "api/swarm")["list"] if n["peer_id"] == worker)
    assert listed["policy_version"] == 3 and listed["tokens_per_min"] >= 6.4
    cells = swarm_cells(driver, worker)
    assert float(cells[6].replace(",", "")) == pytest.approx(listed["tokens_per_min"], abs=0.05)
    assert (
        cells[8]
        == {"public": "public", "private": "behind NAT", "unknown": "unchecked"}[listed["reachability"]]
    )
    cells = leaderboard_cells(driver, worker)
    assert (
        cells[1] == name
        and cells[3] == f"{credit.roles['inference'].total:,.0f}"
        and cells[8] == f"{credit.total:,.0f}"
    )
    reasons = {cells[0]: cells[1] for cells in table_rows(driver, "#reasons tbody tr")}
    api_reasons = {r["reason"]: str(r["count"]) for r in fetch(url + "api/verification")["by_reason"]}
    ledger_reasons = Counter(r.reason for r in ledger.receipts() if r.reason)
    assert reasons == api_reasons == {reason: str(n) for reason, n in ledger_reasons.items()}
    assert reasons["sampling"] == "1"
    # the ban that rejection caused is on record, and listed with a link to the verdict behind it
    [banned] = fetch(url + "api/verification")["banned"]
    [row] = table_rows(driver, "#banned tbody tr")
    assert (
        banned["peer_id"] == worker
        and row[2] == "1"
        and row[4] == "sampling 1"
        and row[3].startswith("until")
    )
    link = driver.find_element(By.CSS_SELECTOR, "#banned tbody tr td a[href^='/api/receipts']")
    assert link.get_attribute("href").endswith(banned["reasons"][0]["receipts_url"])
    assert driver.find_element(By.CSS_SELECTOR, "#history-plot svg rect") is not None
    for chart in ("history-plot", "loss-plot"):
        check_axes(driver, chart)
    note = driver.find_element(By.ID, "leaderboard-note").text  # what a point of credit is
    assert "inference 1 per accepted rollout token" in note and "trainer 1 per token trained" in note
    check_training(driver, url)

    # a new receipt lands in the ledger: the page redraws by itself (server-sent events)
    ledger.add(_verdict(run, "val-a", worker_bytes, 1000))
    total = credit.total + 1000
    wait.until(lambda d: leaderboard_cells(d, worker)[8] == f"{total:,.0f}")
    assert driver.find_element(By.ID, "accepted").text == str(fetch(url + "api/verification")["accepted"])
    # and so does the training panel when a round's receipts arrive
    steps = fetch(url + "api/training")["outer_steps"]
    ledger.add_many(_training_round(run, step=8, losses=(2.5, 2.7)))
    wait.until(lambda d: d.find_element(By.ID, "outer-steps").text == str(steps + 1))
    check_training(driver, url)
    screenshot(driver, tmp_path, "dashboard.png")

    driver.get(f"{url}node/{worker}")
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    assert not driver.find_element(By.ID, "overview").is_displayed()
    assert driver.find_element(By.ID, "node-name").text == name
    assert driver.find_element(By.ID, "node-total").text == f"{total:,.0f}"
    rejection = table_rows(driver, "#node-rejections tbody tr")[0]
    assert rejection[1] == "sampling"
    screenshot(driver, tmp_path, "dashboard-node.png")


def swarm_cells(driver: Any, peer: str) -> list[str]:
    """The texts of the swarm table's row for `peer`, read in one script call (see `table_rows`)."""
    script = """
        const link = Array.from(document.querySelectorAll('#swarm-table a.peer')).find((a) => a.title === arguments[0]);
        return link ? Array.from(link.closest('tr').cells, (cell) => cell.textContent.trim()) : [];
    """
    cells: list[str] = driver.execute_script(script, peer)
    assert cells, f"{peer} is not in the swarm table"
    return cells


def check_axes(driver: Any, chart: str) -> None:
    """A chart's axes, its three gridlines and their values, read in one script call: the page
    redraws its charts when data arrives, and elements found by one call may be gone by the next."""
    script = """
        const svg = document.querySelector('#' + arguments[0] + ' svg');
        if (!svg) return null;
        return {
            grid: svg.querySelectorAll('line.grid').length,
            axes: svg.querySelectorAll('line.axis').length,
            ticks: Array.from(svg.querySelectorAll('text.tick'), (t) => t.textContent.trim()),
        };
    """
    drawn = driver.execute_script(script, chart)
    assert drawn is not None, f"{chart} has no chart"
    assert (drawn["grid"], drawn["axes"]) == (3, 2), (chart, drawn)
    assert len(drawn["ticks"]) == 3 and all(drawn["ticks"]), (chart, drawn)


def js_number(value: float, digits: int) -> str:
    """`value` as the page's `fmt` writes it (en-US, at most `digits` decimals)."""
    return f"{value:,.{digits}f}".rstrip("0").rstrip(".")


def check_tooltips(driver: Any, panel: dict[str, Any]) -> None:
    """Each point of the loss and reward curves carries a tooltip (an SVG <title>) that names its
    outer step or policy version and its value, as the API gives them."""
    expected = {
        "loss-plot": [f"outer step {p['step']}: loss {js_number(p['loss'], 4)}," for p in panel["loss"]],
        "reward-plot": [
            f"policy version {p['version']}: mean reward {js_number(p['reward'], 3)} "
            for p in panel["reward"]
        ],
    }
    script = "return Array.from(document.querySelectorAll(`#${arguments[0]} svg a > circle > title`), (t) => t.textContent);"
    for plot, prefixes in expected.items():
        titles: list[str] = driver.execute_script(script, plot)
        assert len(titles) == len(prefixes), (plot, titles, prefixes)
        assert all(t.startswith(p) for t, p in zip(titles, prefixes, strict=True)), (plot, titles, prefixes)


def check_training(driver: Any, url: str) -> None:
    """The training panel shows the API's figures, and a linked dot per point of each curve."""
    panel = fetch(url + "api/training")
    figures = driver.execute_script(
        "return ['outer-steps', 'tokens-trained', 'outer-steps-link'].map((id) => document.getElementById(id)"
        ".textContent || '') .concat([document.getElementById('tokens-link').getAttribute('href')]);"
    )
    assert figures[:2] == [f"{panel['outer_steps']:,}", f"{panel['tokens_trained']:,}"], (figures, panel)
    assert figures[3] == panel["receipts_url"]
    assert panel["loss"], "the run's trainers reported their losses"
    for plot, points in (("loss-plot", panel["loss"]), ("reward-plot", panel["reward"])):
        # one script reads them all: the page redraws its plots on every refresh, and an element
        # found before a redraw is stale after it (seen in CI)
        links = driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map((a) => a.getAttribute('href'));",
            f"#{plot} svg a",
        )
        assert links == [p["receipts_url"] for p in points], (plot, links)
    check_tooltips(driver, panel)


def test_an_rl_run_shows_its_policy_figures_in_place_of_outer_steps(browser: Any, tmp_path: Path) -> None:
    """An RL run whose trainer averages with nobody signs no training receipts: the panel showed
    zero outer steps and tokens; it shows the policy version, accepted rollouts and reward."""
    (val, val_id), (_, worker) = new_peer(), new_peer()
    ledger = Ledger(tmp_path / "ledger.db", RUN)
    ledger.add_many(
        [
            rewarded_verdict(val, worker, version=1, reward=0.25),
            rewarded_verdict(val, worker, version=2, reward=0.5),
            rewarded_verdict(val, worker, version=2, reward=0.75),
        ]
    )
    data = DashboardData(ledger, trusted=[val_id])
    with DashboardServer(data, port=0) as server:
        browser.get(server.url)
        wait = WebDriverWait(browser, 30)
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        wait.until(lambda d: d.find_element(By.ID, "latest-version").text == "v2")
        assert browser.find_element(By.ID, "rollouts-accepted").text == "3"
        assert browser.find_element(By.ID, "latest-reward").text == "0.625"
        assert browser.find_element(By.ID, "reward-plot").is_displayed()
        assert not browser.find_element(By.ID, "diloco-figures").is_displayed()
        assert not browser.find_element(By.ID, "loss-plot").is_displayed()
        panel = fetch(server.url + "api/training")
        link = browser.find_element(By.ID, "version-link").get_dom_attribute("href")
        assert link == panel["latest_version_url"]
        assert [p["version"] for p in panel["reward"]] == [1, 2]
        check_tooltips(browser, panel)
        check_axes(browser, "reward-plot")
        screenshot(browser, tmp_path, "dashboard-rl.png")
    ledger.close()


def test_the_page_matches_the_api_and_the_ledger_and_updates_live(browser: Any, tmp_path: Path) -> None:
    run, ledger = build_run(tmp_path / "ledger.db")
    data = DashboardData(ledger, trusted=run.trusted)
    data.set_live_nodes(run.live_nodes())
    with DashboardServer(data, port=0) as server:
        check_page(browser, server.url, ledger, run, peer_text(run.peers["alice"].peer_id), tmp_path)
        assert "live as inference" in browser.find_element(By.ID, "node-status").text
    ledger.close()


def test_the_weights_table_pages_to_older_versions_and_back(browser: Any, tmp_path: Path) -> None:
    """The table showed the newest 20 versions, "the newest 20 of 45", and no way to the others."""
    run, ledger = build_run(tmp_path / "ledger.db")
    sources, fetcher = [run.peers["trainer-a"], run.peers["trainer-b"]], run.peers["alice"].peer_id
    ledger.add_many([receipts.transfer(sources[v % 2].key, fetcher, version=v) for v in range(1, 46)])
    data = DashboardData(ledger, trusted=run.trusted)
    with DashboardServer(data, port=0) as server:
        browser.get(server.url)
        wait = WebDriverWait(browser, 30)
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        wait.until(lambda d: d.find_element(By.ID, "live").text == "live")
        assert weights_shown(browser) == list(range(45, 25, -1))
        assert browser.find_element(By.ID, "weights-note").text == "versions 1 to 20 of 45, newest first"
        newer, older = (browser.find_element(By.ID, f"weights-{which}") for which in ("newer", "older"))
        assert not newer.is_enabled() and older.is_enabled()

        older.click()
        wait.until(lambda d: weights_shown(d)[:1] == [25])
        assert weights_shown(browser) == list(range(25, 5, -1))
        assert browser.find_element(By.ID, "weights-note").text == "versions 21 to 40 of 45, newest first"
        # a new version: the page redraws by itself and still shows the same versions
        ledger.add(receipts.transfer(sources[0].key, fetcher, version=46))
        wait.until(lambda d: d.find_element(By.ID, "weights-note").text.endswith("of 46, newest first"))
        assert weights_shown(browser) == list(range(25, 5, -1))

        older.click()
        wait.until(lambda d: weights_shown(d) == [5, 4, 3, 2, 1])
        assert not older.is_enabled() and newer.is_enabled()
        screenshot(browser, tmp_path, "dashboard-weights.png")
        newer.click()
        wait.until(lambda d: weights_shown(d) == list(range(25, 5, -1)))
    ledger.close()


def weights_shown(driver: Any) -> list[int]:
    return [int(cells[0]) for cells in table_rows(driver, "#weights tbody tr")]


@pytest.mark.slow
def test_the_dashboard_command_on_a_local_swarm(browser: Any, tmp_path: Path) -> None:
    """`hivenet dashboard` as a process, discovering a seed and two nodes through the DHT."""
    run, ledger = build_run(tmp_path / "ledger.db")
    with LocalSwarm(run_id=RUN, workdir=tmp_path) as swarm:
        swarm.start(1, roles=["relay"])
        # a standalone validator of an RL run whose trainer has not come yet (a validator of a run
        # that is not RL is refused)
        trainer = create_identity(tmp_path / "trainer.key").peer_id.to_base58()
        swarm.add_node(roles=["validator"], extra_args=["--rl", "--publisher", trainer])
        swarm.wait_converged()
        worker = swarm.nodes["node1"].peer_id  # a live relay, named "node1" in its record
        dashboard = _start_dashboard(swarm, ledger, run, tmp_path / "dashboard.log")
        try:
            url = dashboard.stdout.readline().strip()  # type: ignore[union-attr]
            assert url.startswith("http://127.0.0.1:"), url
            assert wait_until(lambda: fetch(url + "api/swarm")["nodes"] == 3, timeout_s=60)
            assert fetch(url + "api/swarm")["by_role"] == {"relay": 1, "seed": 1, "validator": 1}
            check_page(browser, url, ledger, run, worker, tmp_path)
            assert browser.find_element(By.ID, "node-name").text == "node1"
            assert "live as relay" in browser.find_element(By.ID, "node-status").text
            browser.get(url)
            WebDriverWait(browser, 30).until(lambda d: len(table_rows(d, "#swarm-table tbody tr")) == 3)
            rows = {cells[2]: cells for cells in table_rows(browser, "#swarm-table tbody tr")}
            seed = next(n for n in fetch(url + "api/swarm")["list"] if n["roles"] == ["seed"])
            assert rows["seed"][0] == seed["label"] != ""  # a seed without a name shows a label
            assert rows["relay"][0] == "node1"
            assert all(cells[4].endswith(" ago") for cells in rows.values())  # when each record was signed
            recent = next(
                r["recent"] for r in fetch(url + "api/leaderboard")["rows"] if r["peer_id"] == worker
            )
            assert (
                abs(float(rows["relay"][5].replace(",", "")) - recent) <= 0.5
            )  # as the leaderboard shows it
        finally:
            dashboard.terminate()
            dashboard.wait(timeout=30)
    ledger.close()


def _verdict(
    run: DashboardRun, validator: str, worker: bytes, tokens: int, reason: str = "", ban_s: float = 0.0
) -> bytes:
    return receipts.verdict(
        run.peers[validator].key, worker, tokens=tokens, accepted=not reason, reason=reason, ban_s=ban_s
    )


def _training_round(run: DashboardRun, *, step: int, losses: tuple[float, float]) -> list[bytes]:
    trainers = [run.peers[name] for name in ("trainer-a", "trainer-b")]
    return training_round(
        {p.peer_id: (p.key, loss) for p, loss in zip(trainers, losses, strict=True)}, step=step
    )


def _start_dashboard(
    swarm: LocalSwarm, ledger: Ledger, run: DashboardRun, log: Path
) -> subprocess.Popen[str]:
    trusted = [arg for peer in run.trusted for arg in ("--trusted", peer_text(peer))]
    command = [sys.executable, "-m", "cli.main", "dashboard", "--run", RUN, "--initial-peers", swarm.seed_multiaddr,
               "--ledger", str(ledger.path), "--port", "0", "--refresh", "1", *trusted]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True
    )
