package io.fifolane.bench;

import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.StoreBuilder;
import org.apache.kafka.streams.state.Stores;

/**
 * fifolane's table job in Kafka Streams: the latest version per entity in a persistent
 * RocksDB store, stale versions dropped, {@code type/key -> value} to a compacted topic.
 *
 * <pre>
 * java -cp ... io.fifolane.bench.TableApp --bootstrap HOST:PORT --input T --output T
 *     --application-id ID --state-dir DIR --schemas schemas/
 *     [--guarantee exactly_once_v2|at_least_once] [--commit-interval-ms 250]
 *     [--variant changelog|single-write] [--threads 1]
 *     [--warmup-input T --warmup-output T --warmup-events N]
 * </pre>
 *
 * Variants: {@code changelog} is how a Kafka Streams user writes it (the store is backed by
 * its changelog topic, so every change is written twice: changelog and output);
 * {@code single-write} disables the store's changelog, so only the output is written, like
 * fifolane's state topic (which is both), at the price of a store that cannot be restored.
 *
 * <p>Warm-up: with --warmup-input, the same topology first runs under its own application
 * id over --warmup-events events of that topic and is closed, so the measured run starts
 * with a warm JIT. Runs until SIGTERM; exits 1 if the streams client fails.
 */
public final class TableApp {
    private TableApp() {}

    static Topology topology(String input, String output, boolean changelog, Catalog catalog,
                             AtomicLong processed) {
        StoreBuilder<KeyValueStore<String, byte[]>> store = Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore(LatestVersion.STORE), Serdes.String(), Serdes.ByteArray());
        if (!changelog) {
            store = store.withLoggingDisabled();
        }
        StreamsBuilder builder = new StreamsBuilder();
        builder.addStateStore(store);
        builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
               .process(() -> new LatestVersion(catalog, processed), LatestVersion.STORE)
               .to(output, Produced.with(Serdes.String(), Serdes.ByteArray()));
        return builder.build();
    }

    static Properties config(Map<String, String> o, String appId, String stateDir) {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, o.get("bootstrap"));
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, o.getOrDefault("guarantee", "exactly_once_v2"));
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, o.getOrDefault("commit-interval-ms", "250"));
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, o.getOrDefault("threads", "1"));
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        return p;
    }

    private static Map<String, String> parse(String[] args) {
        Map<String, String> o = new HashMap<>();
        for (int i = 0; i < args.length; i++) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("expected --name value pairs, got " + args[i]);
            }
            o.put(args[i].substring(2), args[++i]);
        }
        for (String required : new String[] {"bootstrap", "input", "output", "application-id", "state-dir", "schemas"}) {
            if (!o.containsKey(required)) {
                throw new IllegalArgumentException("missing --" + required);
            }
        }
        String variant = o.getOrDefault("variant", "changelog");
        if (!variant.equals("changelog") && !variant.equals("single-write")) {
            throw new IllegalArgumentException("--variant must be changelog or single-write, not " + variant);
        }
        return o;
    }

    /** Run the topology over the warm-up topic until it has processed {@code events}, then close. */
    private static void warmUp(Map<String, String> o, Catalog catalog, boolean changelog) throws InterruptedException {
        long events = Long.parseLong(o.getOrDefault("warmup-events", "0"));
        AtomicLong processed = new AtomicLong();
        String appId = o.get("application-id") + "-warmup";
        KafkaStreams warm = new KafkaStreams(
                topology(o.get("warmup-input"), o.get("warmup-output"), changelog, catalog, processed),
                config(o, appId, o.get("state-dir") + "-warmup"));
        long t0 = System.nanoTime();
        warm.start();
        long deadline = t0 + TimeUnit.SECONDS.toNanos(180);
        while (processed.get() < events && System.nanoTime() < deadline
               && warm.state() != KafkaStreams.State.ERROR) {
            Thread.sleep(50);
        }
        warm.close(Duration.ofSeconds(30));
        System.err.printf("warm-up: %d events in %.1f s%n", processed.get(), (System.nanoTime() - t0) / 1e9);
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> o = parse(args);
        boolean changelog = o.getOrDefault("variant", "changelog").equals("changelog");
        Catalog catalog = Catalog.load(Path.of(o.get("schemas")));
        if (o.containsKey("warmup-input")) {
            warmUp(o, catalog, changelog);
        }
        AtomicLong processed = new AtomicLong();
        KafkaStreams streams = new KafkaStreams(
                topology(o.get("input"), o.get("output"), changelog, catalog, processed),
                config(o, o.get("application-id"), o.get("state-dir")));
        CountDownLatch failed = new CountDownLatch(1);
        streams.setUncaughtExceptionHandler(e -> {
            e.printStackTrace();
            failed.countDown();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.ERROR) {
                failed.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(Duration.ofSeconds(30))));
        streams.start();
        System.err.println("started " + o.get("application-id") + " (" + o.getOrDefault("guarantee", "exactly_once_v2")
                           + ", " + o.getOrDefault("variant", "changelog") + ")");
        failed.await();
        System.err.println("the streams client failed");
        System.exit(1);
    }
}
