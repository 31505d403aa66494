"""The store under load and at its edges: one writer + 8 readers, non-finite values, params,
and migrations that match the ORM models, each on SQLite and on PostgreSQL (``store_url``)."""

from __future__ import annotations

import math
import re
import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from pydantic import ValidationError
from sqlalchemy import delete, func, inspect, select, text

from backend.jobs.sink import SqliteMetricsSink
from backend.schemas.errors import Conflict, NotFound
from backend.settings import Settings
from backend.store import metric_store, run_store
from backend.store.db import make_engine, make_session_factory, parse_database_url, transaction
from backend.store.migrate import MIGRATIONS_DIR, alembic_config, migrate, upgrade
from backend.store.tables import Base, LatestMetric, Metric, MetricRollup, Run
from tests.backend.conftest import OLD_EXPERIMENT, old_store


@pytest.fixture
def sessions(store_url):
    engine = make_engine(store_url)
    upgrade(engine)
    yield make_session_factory(engine)
    engine.dispose()


def _head() -> str:
    (head,) = ScriptDirectory.from_config(alembic_config()).get_heads()
    return head


def _tables(engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def test_migrations_form_one_line():
    """Two branches that each add revision N leave Alembic with two heads and no store starts."""
    versions = MIGRATIONS_DIR / "versions"
    ids = [re.search(r'^revision = "(\w+)"', f.read_text(), re.M).group(1) for f in versions.glob("0*.py")]
    assert len(ids) == len(set(ids)), f"revision ids repeat: {sorted(ids)}"
    assert len(ScriptDirectory.from_config(alembic_config()).get_heads()) == 1


def test_sqlite_pragmas(tmp_path):
    engine = make_engine(tmp_path / "aah.db")
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 30000
    engine.dispose()


def test_database_url_setting(tmp_path):
    assert Settings(data_dir=tmp_path).db_url == f"sqlite:///{tmp_path / 'aah.db'}"
    url = "postgresql://aah:secret@db.example:5432/aah"
    assert Settings(data_dir=tmp_path, database_url=url).db_url == url
    assert parse_database_url(url).drivername == "postgresql+psycopg"  # psycopg 3, the pinned driver
    for bad, message in (("mysql://u:secret@h/db", "unsupported database 'mysql'"),
                         ("not a url", "not a SQLAlchemy URL"), ("postgresql://u:secret@h:port/db", "not a SQL")):
        with pytest.raises(ValidationError, match=message) as info:
            Settings(data_dir=tmp_path, database_url=bad)
        assert "secret" not in str(info.value)  # a password never reaches an error message


def test_migrations_match_the_models(sessions):
    with sessions() as s:
        diff = compare_metadata(MigrationContext.configure(s.connection()), Base.metadata)
    assert diff == []


def test_upgrade_is_idempotent(store_url):
    engine = make_engine(store_url)
    upgrade(engine)
    upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == _head()
    engine.dispose()


def test_a_fresh_store_migrates_up_and_down(store_url):
    engine = make_engine(store_url)
    upgrade(engine)
    assert _tables(engine) >= set(Base.metadata.tables)
    migrate(engine, "base", down=True)
    assert _tables(engine) <= {"alembic_version"}
    upgrade(engine)
    with transaction(make_session_factory(engine)) as s:
        run_id = run_store.create_run(s, name="again", experiment="e")
        metric_store.log_metrics(s, run_id, [("loss", 1, 2.0, 1.0)])
        assert metric_store.read_metrics(s, run_id)["loss"].value == [2.0]
    engine.dispose()


def test_sqlite_keeps_rollups_in_key_order_across_migrations(tmp_path):
    """0013: on SQLite metric_rollups is a WITHOUT ROWID table (rows clustered by series, level and
    bucket); down to 0012 and up again, its rows stay."""
    engine = make_engine(tmp_path / "aah.db")
    upgrade(engine)

    def table() -> tuple[str, list]:
        with engine.connect() as conn:
            sql = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = 'metric_rollups'").scalar_one()
            return sql, conn.exec_driver_sql("SELECT * FROM metric_rollups ORDER BY 1, 2, 3, 4").all()

    with transaction(make_session_factory(engine)) as s:
        run_id = run_store.create_run(s, name="r", experiment="e")
        metric_store.log_metrics(s, run_id, [("loss", step, step % 7 - 3.0, 1.0) for step in range(500)])
    migrate(engine, "0013", down=True)  # (0014 changes the rows: levels four times apart)
    sql, rows = table()
    assert sql.endswith("WITHOUT ROWID") and len(rows) > 32
    migrate(engine, "0012", down=True)
    assert table() == (sql.removesuffix(" WITHOUT ROWID"), rows)
    migrate(engine, "0013")
    assert table() == (sql, rows)
    engine.dispose()


def test_upgrading_an_old_store_keeps_every_row(store_url):
    """Rebuilding runs (0002, 0003 on SQLite) must not cascade into params, metrics or plans.

    The rows are written with SQL of the 0001 schema: today's ORM models have columns that
    the old tables lack."""
    engine = old_store(store_url, "0001", OLD_EXPERIMENT,
                       "INSERT INTO runs (id, name, experiment_id, status, created_at, read_only) "
                       "VALUES (1, 'old', 1, 'FINISHED', 0, false)",
                       "INSERT INTO params (run_id, key, value) VALUES (1, 'lr', '0.1')",
                       "INSERT INTO metrics (run_id, key, step, value, timestamp) VALUES (1, 'loss', 1, 2.0, 1.0)",
                       "INSERT INTO window_plans (run_id, step, layer, head, \"window\") "
                       "VALUES (1, 1, 0, 0, 4), (1, 1, 0, 1, NULL)")
    run_id = 1
    upgrade(engine)
    sessions = make_session_factory(engine)
    with transaction(sessions) as s:
        assert run_store.get_run(s, run_id).source == "job"
        assert run_store.get_run(s, run_id).params == {"lr": "0.1"}
        assert metric_store.read_metrics(s, run_id)["loss"].value == [2.0]
        assert run_store.read_plan(s, run_id).windows == [[4, None]]
        if engine.dialect.name == "sqlite":
            assert s.execute(text("PRAGMA foreign_keys")).scalar() == 1
    engine.dispose()


def test_run_ids_are_never_reused(sessions):
    with transaction(sessions) as s:
        first = run_store.create_run(s, name="a", experiment="e")
        s.execute(delete(Run).where(Run.id == first))
        assert run_store.create_run(s, name="b", experiment="e") == first + 1


def test_nonfinite_values_round_trip_with_their_kind(sessions):
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name="r", experiment="e")
        metric_store.log_metrics(s, run_id, [("x", 1, math.nan, 1.0), ("x", 2, math.inf, 2.0),
                                             ("x", 3, -math.inf, 3.0), ("x", 4, 1.5, 4.0)])
    with transaction(sessions) as s:
        specials = list(s.scalars(select(Metric.special).order_by(Metric.step)))
        assert specials == ["nan", "inf", "-inf", None]
        series = metric_store.read_metrics(s, run_id)["x"]
        assert series.value == ["nan", "inf", "-inf", 1.5]
        assert (series.nonfinite.step, series.nonfinite.kind) == ([1, 2, 3], ["nan", "inf", "-inf"])
        assert run_store.latest_values(s, [run_id])[run_id] == {"x": 1.5}



def test_any_key_and_number_arrive_exactly(sessions):
    """Keys with quotes, backslashes, commas, braces, spaces or "NULL", and extreme numbers, stored as sent."""
    keys = ['a"b', "c\\d", "e,f", "{g}", "h i", "NULL", "null", "é/ü:ß", "'", "\\\"", " x "]
    values = [0.1 + 0.2, 1e-300, -1.7976931348623157e308, 5e-324, -0.0, 123456789.123456789, 2.0**-1074]
    rows = [(k, step, values[(i + step) % len(values)], 1.7e9 + step / 3)
            for i, k in enumerate(keys) for step in (0, 1, 2**62)]
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name="r", experiment="e")
        assert metric_store.log_metrics(s, run_id, rows) == len(rows)
    with transaction(sessions) as s:
        stored = s.execute(select(Metric.key, Metric.step, Metric.value, Metric.timestamp)
                           .where(Metric.run_id == run_id)).all()
        assert sorted(map(tuple, stored)) == sorted(rows)
        assert metric_store.metric_keys(s, run_id) == sorted(keys)

def test_latest_value_follows_the_highest_step(sessions):
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name="r", experiment="e")
        metric_store.log_metrics(s, run_id, [("x", 5, 5.0, 1.0)])
        metric_store.log_metrics(s, run_id, [("x", 3, 3.0, 2.0)])  # a late, older step does not win
        assert run_store.latest_values(s, [run_id])[run_id] == {"x": 5.0}


def test_many_plans_are_stored_at_once_and_a_plan_at_a_stored_step_replaces_it(sessions):
    plans = [(step, [[4 + step % 3, None], [16, 8 * (1 + step % 2)]]) for step in range(5, 4005, 5)]  # 800 plans
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name="r", experiment="e")
        run_store.log_plans(s, run_id, plans)
        run_store.log_plans(s, run_id, [])  # nothing to store
        run_store.log_plan(s, run_id, 10, [[64, 64], [None, None]])
        assert run_store.plan_steps(s, run_id) == [step for step, _ in plans]
        assert all(run_store.read_plan(s, run_id, step).windows == windows for step, windows in plans[::97])
        assert run_store.read_plan(s, run_id, 10).windows == [[64, 64], [None, None]]
        assert run_store.read_plan(s, run_id).windows == plans[-1][1]


def test_params_are_write_once(sessions):
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name="r", experiment="e", params={"lr": "0.1"})
        run_store.log_params(s, run_id, {"lr": "0.1", "seed": "0"})
        with pytest.raises(Conflict, match="params cannot change"):
            run_store.log_params(s, run_id, {"lr": "0.2"})


def test_one_writer_and_eight_readers_lose_nothing(sessions, tmp_path):
    """A training-style sink writes in batches while 8 threads keep reading series and summaries."""
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name="load", experiment="e")
    sink = SqliteMetricsSink(sessions, run_id, tmp_path, seq_len=64, flush_rows=97, flush_s=0.05)
    n_steps, keys = 400, ("train_loss", "lr", "tokens_per_s")
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0] * 8

    def reader(i: int) -> None:
        try:
            while not stop.is_set():
                with transaction(sessions) as s:
                    series = metric_store.read_metrics(s, run_id, ["train_loss"])
                    steps = series["train_loss"].step if series else []
                    assert steps == sorted(steps) and len(steps) == len(set(steps))
                    run_store.get_run(s, run_id)
                reads[i] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    try:
        for step in range(1, n_steps + 1):
            sink.on_metrics(step, {k: step * 0.5 for k in keys})
        sink.flush()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert all(n > 0 for n in reads)
    with transaction(sessions) as s:
        assert s.scalar(select(func.count()).select_from(Metric).where(Metric.run_id == run_id)) == n_steps * 3
        assert run_store.get_run(s, run_id).summary == {k: n_steps * 0.5 for k in sorted(keys)}


def test_writers_of_overlapping_batches_at_once_store_each_step_once(sessions):
    """Four writers (a client retrying while its first try still runs) send overlapping batches together."""
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name="retries", experiment="e")
    batches = [[(k, step, float(w), 1.0) for k in ("a", "b") for step in range(w * 50, w * 50 + 200)]
               for w in range(4)]
    start = threading.Barrier(len(batches))
    written: list[int] = []
    errors: list[BaseException] = []

    def writer(rows: list) -> None:
        try:
            start.wait()
            with transaction(sessions) as s:
                written.append(metric_store.log_metrics(s, run_id, rows))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(rows,)) for rows in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    n_steps = 3 * 50 + 200  # steps 0..349, for each key
    assert sum(written) == 2 * n_steps
    with transaction(sessions) as s:
        assert metric_store.metrics_version(s, run_id) == (2 * n_steps, 2)
        steps = metric_store.read_metrics(s, run_id)["a"].step
        assert steps == list(range(n_steps))
        assert run_store.latest_values(s, [run_id])[run_id] == {"a": 3.0, "b": 3.0}


def test_metrics_need_their_run_and_go_with_it(sessions):
    """Metric rows have no foreign key (a per-row check cost a third of a PostgreSQL batch): a batch for
    a run that does not exist is refused whole, and deleting runs deletes their points and rollups."""
    with transaction(sessions) as s:
        kept, gone = (run_store.create_run(s, name=name, experiment="fk") for name in ("kept", "gone"))
        for run_id in (kept, gone):
            metric_store.log_metrics(s, run_id, [("loss", step, 1.0 / step, 1.0) for step in range(1, 100)])
    with pytest.raises(NotFound, match="run 999"), transaction(sessions) as s:
        metric_store.log_metrics(s, 999, [("loss", 1, 1.0, 1.0)])
    with transaction(sessions) as s:
        run_store.delete_runs(s, [gone])
    with transaction(sessions) as s:
        for table in (Metric, MetricRollup, LatestMetric):
            owners = set(s.scalars(select(table.run_id).distinct()))
            assert owners == {kept}, table.__tablename__
        assert metric_store.read_metrics(s, kept)["loss"].step == list(range(1, 100))
        with pytest.raises(NotFound):
            run_store.get_run(s, gone)


def test_advance_run_never_revives_a_run_that_ended_after_its_caller_read_it(sessions):
    """The cluster poller reads a run, then moves its status; a cancel that ended the run in between wins
    (before, the poller wrote PENDING back over KILLED and the engine's later failure ended it FAILED)."""
    with transaction(sessions) as s:
        run_id = run_store.create_run(s, name="queued", experiment="e", status="PENDING")
    with transaction(sessions) as s:
        stale = run_store.get_run(s, run_id)  # what the poller saw
    with transaction(sessions) as s:
        assert run_store.end_run(s, run_id, "KILLED", "cancelled by the user")
    with transaction(sessions) as s:
        assert stale.status == "PENDING"
        assert not run_store.advance_run(s, run_id, status="PENDING", pending_reason="waiting for resources")
        assert not run_store.end_run(s, run_id, "FAILED", "the engine gave up starting it")
    with transaction(sessions) as s:
        run = run_store.get_run(s, run_id)
        assert (run.status, run.error, run.pending_reason) == ("KILLED", "cancelled by the user", None)
    with transaction(sessions) as s:
        active = run_store.create_run(s, name="running", experiment="e", status="PENDING")
        assert run_store.advance_run(s, active, status="RUNNING", pending_reason=None)
    with transaction(sessions) as s:
        assert run_store.get_run(s, active).status == "RUNNING"
