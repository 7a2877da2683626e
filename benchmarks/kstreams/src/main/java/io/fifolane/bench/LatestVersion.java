package io.fifolane.bench;

import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The table job: keep the latest version of every entity in a RocksDB store, drop a
 * version that is not newer than the stored one, and forward {@code type/key -> value}
 * (a delete forwards a tombstone, and its version stays in the store).
 *
 * <p>Store value: the version (8 bytes, big-endian), then the Avro value (empty for a delete).
 */
final class LatestVersion implements Processor<byte[], byte[], String, byte[]> {
    static final String STORE = "latest";

    private final Catalog catalog;
    private final AtomicLong processed;
    private ProcessorContext<String, byte[]> context;
    private KeyValueStore<String, byte[]> store;

    LatestVersion(Catalog catalog, AtomicLong processed) {
        this.catalog = catalog;
        this.processed = processed;
    }

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
        this.context = context;
        this.store = context.getStateStore(STORE);
    }

    @Override
    public void process(Record<byte[], byte[]> record) {
        processed.incrementAndGet();
        Catalog.Entity e;
        try {
            e = catalog.decode(record.value());
        } catch (IllegalArgumentException bad) {
            return;  // not an entity event: a real app would send it to a dead-letter topic
        }
        byte[] old = store.get(e.key());
        if (old != null && ByteBuffer.wrap(old, 0, 8).getLong() >= e.version()) {
            return;  // stale: not newer than the applied version
        }
        byte[] body = e.delete() ? new byte[0] : record.value();
        byte[] stored = ByteBuffer.allocate(8 + body.length).putLong(e.version()).put(body).array();
        store.put(e.key(), stored);
        byte[] out = e.delete() ? null : Arrays.copyOfRange(stored, 8, stored.length);
        context.forward(record.withKey(e.key()).withValue(out));
    }
}
