"""The ``ratelimited`` signal finds each sender's receivers once (a flood sends it on every
refusal), and a receiver connected or disconnected later is heard or not at once."""

from __future__ import annotations

import gc
from typing import Any

from ratelimit_app import signals
from ratelimit_app.middleware import RatelimitMiddleware
from ratelimit_app.signals import RefusalSignal


def test_each_senders_receivers_are_found_once_and_connecting_starts_over() -> None:
    signal = RefusalSignal()
    heard: list[tuple[str, Any]] = []

    def anyone(sender: Any, **kwargs: Any) -> None:
        heard.append(("anyone", sender))

    def middleware_only(sender: Any, **kwargs: Any) -> None:
        heard.append(("middleware", sender))

    signal.connect(anyone)
    looked: list[Any] = []
    live = signal._live_receivers

    def counting(sender: Any) -> Any:
        found = live(sender)
        looked.append(dict(signal.sender_receivers_cache))
        return found

    signal._live_receivers = counting  # type: ignore[method-assign]
    for _ in range(3):
        signal.send(None)  # @ratelimit's sender: None, which a weak key cannot be
        signal.send(RatelimitMiddleware)
    assert set(looked[-1]) == {None, RatelimitMiddleware}
    assert len(looked) == 2  # looked up at each sender's first send, then sent from it
    assert heard == [("anyone", None), ("anyone", RatelimitMiddleware)] * 3
    heard.clear()
    signal.connect(middleware_only, sender=RatelimitMiddleware)  # heard from the next send
    assert signal.sender_receivers_cache == {}
    signal.send(RatelimitMiddleware)
    signal.send(None)
    assert heard == [
        ("anyone", RatelimitMiddleware),
        ("middleware", RatelimitMiddleware),
        ("anyone", None),
    ]
    heard.clear()
    signal.disconnect(anyone)
    signal.send(None)
    signal.send(RatelimitMiddleware)
    assert heard == [("middleware", RatelimitMiddleware)]


def test_a_receiver_gone_is_no_longer_called() -> None:
    signal = RefusalSignal()
    heard: list[str] = []

    class Receiver:
        def __call__(self, sender: Any, **kwargs: Any) -> None:
            heard.append("called")

    receiver = Receiver()
    signal.connect(receiver)  # weakly
    signal.send(None)
    del receiver
    gc.collect()
    signal.send(None)
    assert heard == ["called"]


def test_the_senders_kept_are_bounded() -> None:
    signal = RefusalSignal()
    signal.connect(lambda sender, **kwargs: None, weak=False)
    for i in range(signals.SENDERS_KEPT * 3):
        signal.send(type(f"Sender{i}", (), {}))
    assert 0 < len(signal.sender_receivers_cache) <= signals.SENDERS_KEPT


def test_the_ratelimited_signal_is_one() -> None:
    assert isinstance(signals.ratelimited, RefusalSignal)


def test_a_send_answers_as_djangos_own_signal() -> None:
    """Sent from what was found, the receivers hear what Django's own Signal tells them
    (the same arguments, in the same order, bound methods held weakly included), and the
    responses are the same, send after send."""
    from django.dispatch import Signal

    heard: list[tuple[str, Any, dict[str, Any]]] = []

    class Listener:
        def method(self, sender: Any, **kwargs: Any) -> str:
            heard.append(("method", sender, kwargs))
            return "m"

    def plain(sender: Any, **kwargs: Any) -> str:
        heard.append(("plain", sender, kwargs))
        return "p"

    listener = Listener()
    answers = []
    for signal in (Signal(use_caching=True), RefusalSignal()):
        signal.connect(plain)
        signal.connect(listener.method)  # a WeakMethod
        signal.connect(plain, sender=RatelimitMiddleware, dispatch_uid="again")
        for _ in range(3):
            answers.append(signal.send(RatelimitMiddleware, group="g", usage={"count": 2}))
        answers.append(signal.send(Listener, group="h"))  # (None: no weak key in Django's)
    ours, django = answers[4:], answers[:4]
    assert ours == django
    assert [r for _, r in ours[0]] == ["p", "m", "p"]
    assert all(type(kw.pop("signal")) is Signal for _, _, kw in heard[: len(heard) // 2])
    assert all(type(kw.pop("signal")) is RefusalSignal for _, _, kw in heard[len(heard) // 2 :])
    assert heard[: len(heard) // 2] == heard[len(heard) // 2 :]


def test_an_async_receiver_is_awaited_as_django_awaits_it() -> None:
    """A sender with an async receiver is sent to by Django's own ``send``, which runs it."""
    heard: list[str] = []
    signal = RefusalSignal()

    def plain(sender: Any, **kwargs: Any) -> None:
        heard.append("plain")

    async def later(sender: Any, **kwargs: Any) -> None:
        heard.append("async")

    signal.connect(plain)
    signal.connect(later)
    for _ in range(2):
        signal.send(None)
    assert heard == ["plain", "async"] * 2
    assert type(signal.sender_receivers_cache[None]) is list  # (not sent from what was found)
