"""Read the Append entries a softdta collector exports to NATS JetStream, each once (docs/export.md).

    python3 examples/export_consumer.py nats://127.0.0.1:4222 [--messages N]
"""
import argparse
import asyncio

import nats


async def main(url: str, messages: int | None) -> None:
    client = await nats.connect(url)
    stream = await client.jetstream().subscribe("softdta.append.>", ordered_consumer=True)  # from the first
    seen = set()
    while messages is None or len(seen) < messages:
        message = await stream.next_msg(timeout=None)
        headers = message.headers
        if headers["Nats-Msg-Id"] in seen:  # published again after a reconnect: the same message
            continue
        seen.add(headers["Nats-Msg-Id"])
        where = f"{headers['Softdta-Collector']} list {headers['Softdta-List']}"
        first, count, size = (int(headers[name]) for name in ("Softdta-Seq", "Softdta-Count", "Softdta-Entry-Bytes"))
        if headers["Softdta-Kind"] == "gap":
            print(f"{where} #{first}..{first + count - 1}: lost")
        for index in range(count if headers["Softdta-Kind"] == "entries" else 0):
            print(f"{where} #{first + index}: {int.from_bytes(message.data[index * size:(index + 1) * size], 'big')}")
    await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--messages", type=int, help="stop after this many messages (default: run until killed)")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.url, arguments.messages))
