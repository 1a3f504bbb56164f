"""One aiohttp session per engine, made on first use: a ClientSession must be created inside the
event loop that uses it, and an engine's clients are built before that loop runs."""

import aiohttp


class LazySession:
    """Holds the session given (or one made by the first `get`) and closes it with `close`."""

    def __init__(self, session: aiohttp.ClientSession | None = None) -> None:
        self._session = session

    def get(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        """Idempotent; a later `get` makes a new session."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
