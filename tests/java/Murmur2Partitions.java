import java.nio.charset.StandardCharsets;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;

/**
 * Where Java puts keys: prints "key-hex murmur2 partition" for each key (hex-encoded on the
 * command line) with Utils.murmur2 and the default partitioner's formula; with a bootstrap
 * and a topic, also produces each key with a KafkaProducer (default partitioner) and prints
 * "sent key-hex partition" from the broker's RecordMetadata.
 *
 *   java -cp 'libs/*' Murmur2Partitions PARTITIONS [BOOTSTRAP TOPIC] KEYHEX...
 */
public class Murmur2Partitions {
    public static void main(String[] args) throws Exception {
        int partitions = Integer.parseInt(args[0]);
        int first = 1;
        String bootstrap = null, topic = null;
        if (args.length > 2 && args[1].contains(":")) {
            bootstrap = args[1];
            topic = args[2];
            first = 3;
        }
        for (int i = first; i < args.length; i++) {
            byte[] key = hex(args[i]);
            int h = Utils.murmur2(key);
            System.out.println(args[i] + " " + h + " " + (Utils.toPositive(h) % partitions));
        }
        if (bootstrap == null) return;
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (int i = first; i < args.length; i++) {
                byte[] key = hex(args[i]);
                RecordMetadata md = producer.send(new ProducerRecord<>(topic, key, "x".getBytes(StandardCharsets.UTF_8))).get();
                System.out.println("sent " + args[i] + " " + md.partition());
            }
        }
    }

    private static byte[] hex(String s) {
        if (s.equals("-")) return new byte[0];
        byte[] out = new byte[s.length() / 2];
        for (int i = 0; i < out.length; i++) out[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
        return out;
    }
}
